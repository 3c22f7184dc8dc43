"""The prompt chunk's library kernels (``fusionc.runtime.library_attention``) compile with NVRTC
for every storage dtype and RoPE style (no GPU needed: they run on the GPU in
tests/gpu/test_prefill_gpu.py)."""
import pytest

from fusionc.runtime.library_attention import rope_source, write_source
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
