"""The prompt chunk's library kernels (``fusionc.runtime.library_attention``) compile with NVRTC
for every storage dtype, RoPE style and attention geometry (no GPU needed: they run on the GPU in
tests/gpu/test_prefill_gpu.py)."""
import pytest

from fusionc.runtime.library_attention import attention_source, rope_source, write_source
from fusionc.runtime.nvrtc import compile_cubin


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_rope_compiles(dtype, style):
    r = compile_cubin(rope_source(dtype, style), "rope.cu")
    assert r.cubin and "fc_rope" in r.kernels


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_cache_write_compiles(dtype):
    r = compile_cubin(write_source(dtype), "write.cu")
    assert r.cubin and "fc_kv_cache_write" in r.kernels


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("g,d", [(4, 128), (1, 80), (8, 64), (2, 256), (3, 96)])
def test_chunk_attention_compiles_without_spills(dtype, g, d):
    r = compile_cubin(attention_source(dtype, g, d), "attention.cu")
    assert r.cubin and r.spills == {"fc_chunk_attention": 0}


def test_host_mirrors_skip_the_copy_back_inside_the_block_only():
    """chunk_attention's rows come from the caller's host copy inside ``host_mirrors`` (no
    device-to-host copy per layer), from the device array outside it."""
    import types

    import numpy as np

    from fusionc.runtime import library_attention as la
    copies = []

    class Dev:   # the parts of a cupy array that _host reads
        data, size = types.SimpleNamespace(ptr=0x1000), 3

        def get(self):
            copies.append(1)
            return np.array([7, 7, 7])
    d, h = Dev(), np.array([1, 2, 3])
    with la.host_mirrors((d, h)):
        assert la._host(d).tolist() == [1, 2, 3] and not copies
    assert la._host(d).tolist() == [7, 7, 7] and copies == [1] and not la._MIRRORS


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("g,d", [(4, 128), (1, 128), (8, 64), (16, 128), (1, 80), (2, 96)])
def test_tensor_core_chunk_attention_compiles_without_spills(dtype, g, d):
    from fusionc.runtime import chunk_tc
    from fusionc.runtime.library_attention import _CONVERT
    assert chunk_tc.covers(dtype, g, d)
    r = compile_cubin(chunk_tc.source(dtype, g, d, _CONVERT[dtype]), "attention_tc.cu")
    assert r.cubin and r.spills == {"fc_chunk_attention_tc": 0}
