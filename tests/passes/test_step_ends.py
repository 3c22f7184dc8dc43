"""The decode step's ends in the DSL (``fusionc.models.blocks.step_ends``): a linear with
``out_dtype`` (the LM head's fp32 logits) in the IR text, the interpreter, the v2 kernel (the
simulator against the interpreter, NVRTC), the library path and v1's refusal; the embedding on
the library path."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fusionc as fc
from fusionc.errors import DSLError, LoweringError, VerifyError
from fusionc.interp import interpret
from fusionc.interp.numerics import round_to
from fusionc.ir import DType, Module, parse_module, print_module
from fusionc.models.blocks import step_ends
from fusionc.models.config import ModelConfig
from fusionc.passes import run_pipeline
from fusionc.passes.stream import v2_pipeline
from fusionc.sim import simulate
from tests.passes.graphs import rel_err


def ends(vocab=1000, hidden=256, dtype="bf16"):
    cfg = ModelConfig("llama", 1, hidden, 4, 4, 64, 512, vocab, 1e-5, 10000.0, dtype=dtype)
    return step_ends(cfg, dtype)


def head_args(vocab, hidden, batch, dtype, rng):
    d = DType(dtype)
    a = {"x": 3 * rng.standard_normal((batch, hidden)),
         "final_norm": 1 + 0.2 * rng.standard_normal(hidden),
         "lm_head": rng.standard_normal((vocab, hidden)) / np.sqrt(hidden)}
    return {k: np.asarray(round_to(v, d), np.float64) for k, v in a.items()}


def test_out_dtype_prints_parses_back_and_is_left_out_at_its_default():
    text = print_module(ends())
    assert "linear(%normed, %lm_head) {out_dtype = f32} : f32[B, 1000]" in text
    assert print_module(parse_module(text)) == text
    plain = fc.graph(lambda x, w: fc.linear(x, w, name="y"), name="lin", x=fc.f16["B", 8],
                     w=fc.f16[4, 8])
    assert "out_dtype" not in print_module(plain)


def test_an_out_dtype_that_is_not_a_float_type_is_named():
    with pytest.raises(DSLError, match="out_dtype.*f16, bf16, f32"):
        fc.graph(lambda x, w: fc.linear(x, w, out_dtype="i32"), name="lin",
                 x=fc.f16["B", 8], w=fc.f16[4, 8])
    text = ("graph @g(%x: f16[B, 8], %w: f16[4, 8]) {\n"
            "  %y = linear(%x, %w) {out_dtype = i32} : i32[B, 4]\n  return %y\n}\n")
    with pytest.raises(VerifyError, match=r"2:\d+.*out_dtype"):
        parse_module(text)


def test_fp32_logits_are_the_sums_unrounded():
    """The interpreter rounds the norm to bf16 but not the logits: they differ from the
    bf16-rounded logits of a plain linear."""
    rng = np.random.default_rng(0)
    args = head_args(1000, 256, 3, "bf16", rng)
    logits, = interpret(ends(), args, graph="head")
    assert logits.dtype == np.float32
    assert not np.array_equal(logits, round_to(logits, DType.bf16))
    ref, = interpret(ends(), args, graph="head", precise=True)
    assert rel_err(logits, ref) <= 1e-2


@settings(max_examples=12, deadline=None)
@given(vocab=st.sampled_from([100, 1000, 4099]), hidden=st.sampled_from([64, 256, 520, 1003]),
       dtype=st.sampled_from(["f16", "bf16"]), batch=st.integers(1, 5),
       wide=st.booleans(), seed=st.integers(0, 2**16))
def test_the_head_kernel_simulates_like_the_interpreter(vocab, hidden, dtype, batch, wide, seed):
    """The RMSNorm prologue and an f32 flush without a rounding step, 64- or 128-row tiles:
    within a few unit roundoffs of the dtype of the interpreter: the f16 prologue rounds x·r
    before the gain (``fusionc.stream.epilogue.norm_activations``), so a normed element may
    differ by one ulp (2u relative) and the logits carry that through the random weights;
    the logits themselves are not rounded."""
    from fusionc.lower.linear_v2 import MAX_BATCH_MMA, fused_rows
    m = ends(vocab, hidden, dtype)
    g = Module((m["head"],))
    rows = 128 if wide and fused_rows(m["head"]) == MAX_BATCH_MMA else 64
    low = run_pipeline(g, v2_pipeline(batch, rows=rows))
    (k,) = [x for x in low.graphs if x.kind == "kernel"]
    assert "round_" not in print_module(Module((k,)))
    args = head_args(vocab, hidden, batch, dtype, np.random.default_rng(seed))
    ref, = interpret(g, args)
    out, = simulate(low, args)
    assert out.dtype == np.float32
    assert rel_err(out, ref) <= 4 * 2.0 ** (-9 if dtype == "bf16" else -11)


@pytest.mark.parametrize("vocab, hidden, mb", [(128256, 4096, 1), (151936, 2560, 16),
                                               (32000, 4096, 128), (1000, 1003, 4)])
def test_the_head_compiles_without_spills(vocab, hidden, mb):
    from fusionc.codegen.compile import compile_kernel
    low = run_pipeline(Module((ends(vocab, hidden)["head"],)), v2_pipeline(mb))
    for k in (x for x in low.graphs if x.kind == "kernel"):
        ck = compile_kernel(k)
        assert ck.spills == 0 and ck.cubin


def test_the_default_fuses_the_head_or_takes_a_gemm_with_fp32_output():
    m = ends(32000, 4096)
    small = fc.compile(m, "head", max_batch=1)
    assert [op.name for op in small.host.body] == ["launch"]
    big = fc.compile(m, "head", max_batch=200)
    (norm, call) = big.host.body
    assert norm.name == "rms_norm" and call.name == "library_call"
    assert call.attr("out_dtype") == "f32" and call.results[0].type.dtype == DType.f32


def test_the_embedding_takes_the_library_path():
    cg = fc.compile(ends(), "embed", max_batch=4)
    assert [op.name for op in cg.host.body] == ["embedding"] and not cg.kernels


def test_bad_inputs_of_the_step_ends_are_named():
    """Ids past i32 are not wrapped by the interpreter; step_ends takes a config; the library
    GEMM takes out_dtype = x's or f32 only (cuBLAS)."""
    from fusionc.errors import CompileError, InputError
    m = ends(100, 64)
    table = np.zeros((100, 64))
    with pytest.raises(InputError, match="i32 values"):
        interpret(m, {"embed": table, "tokens": np.array([2**33], np.int64)}, graph="embed")
    with pytest.raises(InputError, match="ModelConfig"):
        step_ends(None)
    narrow = fc.graph(lambda x, w: fc.linear(x, w, out_dtype="bf16"), name="lin",
                      x=fc.f16["B", 64], w=fc.f16[32, 64])
    with pytest.raises(CompileError, match="out_dtype that of x or f32"):
        fc.compile(narrow, max_batch=200)
