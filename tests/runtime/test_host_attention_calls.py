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
    monkeypatch.setattr(la, "_inv_freq", lambda *a: fake_cupy_array((a[1] // 2,), np.float32))
    import cupy   # no copy: the split's pieces are read in place (a copy would allocate)
    monkeypatch.setattr(cupy, "ascontiguousarray", lambda x: x if x.flags.c_contiguous else
                        pytest.fail(f"a copy of a {x.shape} piece"))
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
    assert names == ["fc_rope", "fc_rope", "fc_kv_cache_append", "fc_kv_cache_append",
                     "fc_decode_attention"]
    from fusionc.runtime import library_attention as la
    name, grid, block, kargs, smem = fake[-1]
    src = la.attention_source("f16", la.head_group(2), 272, decode=True)
    assert len(kargs) == _params(src, "fc_decode_attention") == 13
    assert kargs[1] is args["k_cache"] and kargs[2] is args["v_cache"]   # caches in place
    assert kargs[3] is kargs[4]   # seq_lens (seq_of unread)
    assert grid == (-(-3 * 2 // (block[0] // 32)),) and smem == block[0] // 32 * 2 * 272 * 4
    qkv_row = (4 + 2 * 2) * 272   # the pieces' row stride: the QKV GEMM's output row
    assert int(kargs[12]) == 4 * 272   # q: the rope's contiguous output
    for _, _, _, w, _ in fake[:2]:   # the rope reads q and k in place
        assert int(w[-1]) == qkv_row
    for _, _, _, w, _ in fake[2:4]:
        assert len(w) == _params(la.write_source("f16", True), "fc_kv_cache_append") == 9
        assert int(w[-1]) in (qkv_row, 2 * 272)   # v in place; k the rope's output
