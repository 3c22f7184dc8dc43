"""A call of a graph whose attention runs on the host (v2's mixed path with
``attention-units{host=true}``) on the fake GPU (``benchmarks/cpu_fakes.py``): the library
attention kernels are launched in program order with the arguments their CUDA signatures take
(the kernels themselves run in tests/gpu/test_host_attention_gpu.py)."""
import numpy as np
import pytest

from tests.passes.test_host_attention import _block


class _Kernel:
    """A stand-in for ``cupy.RawKernel``: records (name, grid, block, args, shared_mem)."""

    def __init__(self, source, name, log):
        self.source, self.name, self.log = source, name, log
        self.max_dynamic_shared_size_bytes = 0

    def __call__(self, grid, block, args, shared_mem=0):
        self.log.append((self.name, grid, block, args, shared_mem))


@pytest.fixture
def fake(monkeypatch):
    pytest.importorskip("cuda.bindings")
    from benchmarks.cpu_fakes import fake_cupy_array, fake_gpu
    from fusionc.runtime import library_attention as la
    log = []
    monkeypatch.setattr(la, "_kernel", lambda src, name: _Kernel(src, name, log))
    monkeypatch.setattr(la, "_rows_of", lambda b, dev: fake_cupy_array((b,), np.int32))
    monkeypatch.setattr(la, "_inv_freq", lambda *a: fake_cupy_array((a[1] // 2,), np.float32))
    import cupy   # a copy of a strided piece would run a CuPy kernel: a fresh fake array
    monkeypatch.setattr(cupy, "ascontiguousarray", lambda x: x if x.flags.c_contiguous else
                        fake_cupy_array(x.shape, x.dtype))
    with fake_gpu():
        yield log


def _params(source: str, name: str) -> int:
    """The number of parameters of ``extern "C" __global__ void name(...)`` in ``source``."""
    head = source.split(f"void {name}(", 1)[1].split(")", 1)[0]
    return head.count(",") + 1


def test_host_attention_launches_rope_append_and_attention_in_order(fake):
    import fusionc
    from benchmarks.cpu_fakes import fake_cupy_array
    m = _block(head_dim=272)
    cg = fusionc.compile(m, max_batch=4)
    assert not cg._loaded
    g = m.graphs[0]
    args = {p.name: fake_cupy_array(p.type.concrete({"B": 3}),
                                    np.int32 if p.type.dtype.value == "i32" else np.float16)
            for p in g.params}
    cg(**args)
    names = [x[0] for x in fake]
    assert names == ["fc_rope", "fc_rope", "fc_kv_cache_write", "fc_kv_cache_write",
                     "fc_decode_attention"]
    from fusionc.runtime import library_attention as la
    name, grid, block, kargs, smem = fake[-1]
    src = la.attention_source("f16", la.head_group(2), 272, decode=True)
    assert len(kargs) == _params(src, "fc_decode_attention") == 12
    assert kargs[1] is args["k_cache"] and kargs[2] is args["v_cache"]   # caches in place
    assert kargs[3] is kargs[4]   # seq_lens (seq_of unread)
    assert grid == (-(-3 * 2 // (block[0] // 32)),) and smem == block[0] // 32 * 2 * 272 * 4
    for _, _, _, w, _ in fake[2:4]:
        assert len(w) == _params(la.write_source("f16"), "fc_kv_cache_write")
