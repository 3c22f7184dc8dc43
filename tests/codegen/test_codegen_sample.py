"""A hypothesis sample of random tile programs, and every fused kernel of the examples, compile
to sm_90a cubins without spills (NVRTC ~0.1-1 s each: few examples)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusionc.codegen import compile_kernel
from fusionc.errors import CompileError
from fusionc.ir import parse_module
from tests.codegen.examples import example_kernels, fitting_kernel, fused_module
from tests.sim.programs import collective_kernel, splitk_gemv

pytestmark = pytest.mark.slow   # NVRTC of every example's kernels and of random programs

SLOW = settings(max_examples=6, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


def _ok(text: str) -> None:
    ck = compile_kernel(parse_module(text).graphs[0])
    assert ck.cubin[:4] == b"\x7fELF" and ck.spills == 0, ck.report()


@SLOW
@given(size=st.sampled_from([1, 2, 4, 8, 16]), grid=st.integers(1, 3),
       k_tile=st.sampled_from([1, 3, 8, 16, 64, 200]), n_tile=st.sampled_from([16, 32]),
       dtype=st.sampled_from(["f16", "bf16", "f32"]), scheme=st.sampled_from(["splitk", "gather"]))
def test_random_gemv_programs_compile(size, grid, k_tile, n_tile, dtype, scheme):
    if scheme == "gather" and n_tile % size:
        n_tile = size * 2
    _ok(splitk_gemv(size, grid, k_tile, n_tile, dtype, scheme=scheme))


@SLOW
@given(kind=st.sampled_from(["sum", "max", "gather"]), size=st.sampled_from([1, 2, 4, 8, 16]),
       shape=st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple),
       dtype=st.sampled_from(["f16", "bf16", "f32"]), data=st.data())
def test_random_collective_programs_compile(kind, size, shape, dtype, data):
    axis = data.draw(st.integers(0, len(shape) - 1)) if kind == "gather" else 0
    _ok(collective_kernel(kind, size, 2, shape, dtype, axis=axis))


EXAMPLES = ["llama2_7b", "llama3_8b", "qwen3_qk_norm", "tp2_mlp", "deepseek_v2_lite"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_kernels_compile(example):
    """Every fused kernel of the example compiles; kernels whose tiles do not fit at the
    lowered max_batch are rejected by codegen with a shared-memory error and compile at
    max_batch 1 (the partitioner must count SSA tiles: see fusionc.codegen.smem_required)."""
    for name in example_kernels(example):
        k, lowered = fitting_kernel(example, name)
        ck = compile_kernel(k)
        assert ck.spills == 0, ck.report()
        if lowered:
            with pytest.raises(CompileError, match="bytes of shared memory per CTA"):
                compile_kernel(fused_module(example)[name])
