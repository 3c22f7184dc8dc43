"""Graphs of norm / linear / elementwise ops on design v2: what ``partition-units`` folds into a
linear kernel (an RMSNorm prologue, paired gate/up tiles, epilogue steps), before/after checks,
``simulate(lower(g)) ≈ interpret(g)`` over the example graphs and over random chains
(hypothesis), the errors, and NVRTC builds of each consumer path with a prologue."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fusionc as fc
from fusionc.errors import CompileError, LoweringError, VerifyError
from fusionc.interp import interpret
from fusionc.ir import Module, parse_module
from fusionc.passes import run_pipeline
from fusionc.passes.stream import v2_pipeline
from fusionc.sim import simulate
from tests.passes.graphs import example, inputs, rel_err


def kernels(m: Module):
    return [g for g in m.graphs if g.kind == "kernel"]


def region(k) -> list[str]:
    units = next(op for op in k.body if op.name == "units")
    return [op.name for op in k.body] + ["|"] + [op.name for op in units.regions[0]]


def phases(k) -> list:
    return [op for op in k.body if op.name == "units"]


def test_mlp_is_one_kernel_of_two_phases_with_prologue_pair_and_residual():
    m = run_pipeline(example("graphs_v2", hidden=256, inter=200), "fold-views,partition-units{max_batch=4}")
    k, = kernels(Module(tuple(g for g in m.graphs if g.name.startswith("mlp_k"))))
    assert [op.name for op in k.body] == ["row_rms", "acc_alloc", "units", "units"]
    p1, p2 = phases(k)
    gemv, flush = p1.regions[0]
    assert len(gemv.operands) == 5 and gemv.attr("split") == 200   # gamma, 1/rms; up at 200
    assert flush.attr("epilogue") == "round_bf16,silu_mul"   # the graph rounds gate_up
    assert (flush.attr("signal"), flush.attr("per")) == ("ready0", 4)  # 128 / 32 columns
    assert p1.attr("count") == 7 * 2  # ⌈200/32⌉·2
    wait, gemv2, flush2 = p2.regions[0]
    assert dict(wait.attrs) == {"name": "ready0", "slot": "step", "index": 0, "warp": "producer",
                                "target": 4, "total": 7, "reset": "exit", "scale": "one"}
    assert gemv2.operands[1].name == flush.operands[1].name == "act"
    assert flush2.attr("epilogue") == "round_bf16,add" and flush2.operands[2].name == "x"
    assert [op.name for op in m["mlp"].body] == ["launch"]
    assert [v.name for v in m["mlp"].body[0].results] == ["act", "0"]


def test_the_default_chains_above_eight_rows():
    from fusionc.passes.stream import CHAIN_ABOVE_ROWS
    assert "chain=false" in v2_pipeline(CHAIN_ABOVE_ROWS)
    assert "chain=false" not in v2_pipeline(CHAIN_ABOVE_ROWS + 1)
    assert "chain=false" not in v2_pipeline(1, chain=True)


def test_chain_false_keeps_one_kernel_per_linear():
    m = run_pipeline(example("graphs_v2", hidden=256, inter=200),
                     "fold-views,partition-units{max_batch=4, chain=false}")
    ks = [g for g in kernels(m) if g.name.startswith("mlp_k")]
    assert [len(phases(k)) for k in ks] == [1, 1]
    assert [op.name for op in m["mlp"].body] == ["launch", "launch"]


def test_a_chain_stops_where_the_next_epilogue_reads_a_later_value():
    @fc.graph
    def g(x: fc.f16["B", 64], a: fc.f16[64, 64], b: fc.f16[64, 64], c: fc.f16[64, 64]):
        h = fc.linear(x, a, name="h")
        t = fc.linear(x, c, name="t")      # computed after h's kernel would launch
        return fc.linear(h, b, name="y") + t
    low = run_pipeline(g, "fold-views,partition-units{max_batch=2, siblings=false}")
    assert sorted(len(phases(k)) for k in kernels(low)) == [1, 1, 1]
    low = run_pipeline(g, v2_pipeline(2, chain=True))   # h and t read x: sibling phases
    assert sorted(len(phases(k)) for k in kernels(low)) == [1, 2]


def test_separate_gate_and_up_weights_fold_silu_then_mul():
    m = run_pipeline(example("graphs_v2", hidden=256, inter=200), "fold-views,partition-units{max_batch=2}")
    flushes = [next(op for op in k.body if op.name == "units").regions[0][-1]
               for k in kernels(m) if k.name.startswith("swiglu_k")]
    assert [f.attr("epilogue") for f in flushes] == ["round_bf16,silu", "round_bf16,mul"]


@settings(max_examples=12, deadline=None)
@given(graph=st.sampled_from(["swiglu", "norm_silu", "mlp", "mlp_shard", "linear", "chain",
                              "heads", "lm_head"]),
       hidden=st.sampled_from([128, 256, 520, 1003]), inter=st.sampled_from([64, 200, 328]),
       dtype=st.sampled_from(["f16", "bf16", "f32"]), batch=st.integers(1, 5),
       seed=st.integers(0, 2**16), chain=st.booleans(), wide=st.booleans())
def test_example_graphs_simulate_like_the_interpreter(graph, hidden, inter, dtype, batch, seed,
                                                      chain, wide):
    """Every example graph, 64- or 128-row tiles (where every linear is on tensor cores)."""
    from fusionc.lower.linear_v2 import MAX_BATCH_MMA, fused_rows
    m = example("graphs_v2", hidden=hidden, inter=inter, dtype=dtype)
    g = Module((m[graph],))
    rows = 128 if wide and fused_rows(m[graph]) == MAX_BATCH_MMA else 64
    low = run_pipeline(g, v2_pipeline(batch, chain=chain, rows=rows))
    args = inputs(m[graph], batch, [], np.random.default_rng(seed))
    ref, = interpret(g, args)
    out, = simulate(low, args)
    assert rel_err(out, ref) <= (1e-4 if dtype == "f32" else 1e-2)


STEPS = st.lists(st.sampled_from(["silu", "add", "mul"]), max_size=3)


@settings(max_examples=15, deadline=None)
@given(norm=st.booleans(), bias=st.booleans(), pair=st.sampled_from([None, "silu_mul", "mul"]),
       steps=STEPS, cast=st.booleans(), n=st.sampled_from([40, 64, 130]),
       k=st.sampled_from([64, 136, 260]), dtype=st.sampled_from(["f16", "bf16"]),
       batch=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_random_chains_fold_into_one_kernel(norm, bias, pair, steps, cast, n, k, dtype, batch,
                                            seed):
    """rms_norm? → linear(+bias?) → (split → SwiGLU)? → silu / add / mul steps → cast?: one
    kernel, and it computes what the interpreter does."""
    T = fc.dtype(dtype)
    rows = 2 * n if pair else n

    def body(x, g, w, b, t):
        h = fc.rms_norm(x, g, 1e-5, name="h") if norm else x
        y = fc.linear(h, w, b, name="y") if bias else fc.linear(h, w, name="y")
        if pair:
            gate, up = fc.split(y, [n, n], name=("gate", "up"))
            y = fc.silu_mul(gate, up) if pair == "silu_mul" else fc.silu(gate) * up
        for s in steps:
            y = fc.silu(y) if s == "silu" else (y + t if s == "add" else y * t)
        return fc.cast(y, "f32") if cast else y

    g = fc.graph(body, name="chain", x=T["B", k], g=T[k], w=T[rows, k], b=T[rows], t=T["B", n])
    low = run_pipeline(g, v2_pipeline(batch))
    assert len(kernels(low)) == 1
    rng = np.random.default_rng(seed)
    args = {"x": rng.standard_normal((batch, k)), "g": 1 + 0.2 * rng.standard_normal(k),
            "w": rng.standard_normal((rows, k)) / np.sqrt(k), "b": rng.standard_normal(rows),
            "t": rng.standard_normal((batch, n))}
    args = {a: v for a, v in args.items() if a in {p.name for p in g.graphs[0].params}}
    ref, = interpret(g, args, precise=True)   # the float64 reference (every rounding differs)
    rounded, = interpret(g, args)   # the graph's own roundings: each op's result in bf16/f16
    out, = simulate(low, args)
    assert rel_err(out, rounded) <= 1e-2
    # against float64: the graph's own roundings plus one unit roundoff (bf16 2^-9, f16 2^-11)
    # per 16-bit result, since the kernel rounds at other points (fused SwiGLU, epilogue norm)
    # and a one-ulp difference early in the chain is carried on (Higham, "Accuracy and Stability
    # of Numerical Algorithms", 2002, §3.1: errors of m roundings add up to m·u to first order)
    rounding_points = norm + 1 + (2 if pair == "mul" else 1 if pair else 0) + len(steps)
    u = 2.0 ** (-9 if dtype == "bf16" else -11)
    assert rel_err(out, ref) <= max(1e-2, rel_err(rounded, ref) + rounding_points * u)


def test_a_norm_with_other_uses_is_refused_by_name():
    @fc.graph
    def g(x: fc.f16["B", 64], s: fc.f16[64], w: fc.f16[64, 64]):
        h = fc.rms_norm(x, s, 1e-5, name="h")
        return fc.linear(h, w, name="y") + h
    with pytest.raises(LoweringError, match="rms_norm.*not lowered by lowering v2"):
        run_pipeline(g, v2_pipeline(2))


def test_a_sum_of_two_linears_is_the_second_ones_epilogue():
    @fc.graph
    def g(x: fc.f16["B", 64], a: fc.f16[64, 64], b: fc.f16[64, 64]):
        return fc.add(fc.linear(x, a, name="p"), fc.linear(x, b, name="q"))
    low = run_pipeline(g, v2_pipeline(2))
    flushes = [next(op for op in k.body if op.name == "units").regions[0][-1]
               for k in kernels(low)]
    assert [f.attr("epilogue") for f in flushes] == ["", "round_f16,add"]
    rng = np.random.default_rng(0)
    args = {"x": rng.standard_normal((2, 64)), "a": rng.standard_normal((64, 64)) / 8,
            "b": rng.standard_normal((64, 64)) / 8}
    assert rel_err(simulate(low, args)[0], interpret(g, args)[0]) <= 1e-2


def test_an_elementwise_op_without_a_linear_is_refused_by_name():
    @fc.graph
    def g(x: fc.f16["B", 64], w: fc.f16[64, 64]):
        return fc.linear(fc.silu(x), w, name="y")
    with pytest.raises(LoweringError, match="'silu'.*not lowered by lowering v2"):
        run_pipeline(g, v2_pipeline(2))


FLUSH = """kernel @k {{grid = 4, cluster = 1, threads = 256, max_batch = 2}} (%x: f16[B, 128], %w: f16[64, 128], %t: f16[B, 64], %y: f16[B, 64]) {{
  %acc = acc_alloc() : f32[B, 64]
  units() {{count = 1, group = 1}} ({{
    acc_gemv(%acc, %x, %w) {{rows = 64, cols = 128, n = 64, k = 128}}
    group_flush(%acc, %y{extra}) {{rows = 64, epilogue = "{epi}"}}
  }})
  return %y
}}
"""


@pytest.mark.parametrize("extra, epi, msg", [
    ("", "gelu", "unknown step 'gelu'"),
    ("", "add", "0 epilogue operands"),
    (", %t", "silu_mul,bias", "bias after silu_mul|bias f16\\[B, 64\\]"),
    (", %t, %t", "add,mul,silu_mul", "add before silu_mul"),
    (", %x", "add", "add operand %x"),
])
def test_bad_epilogues_are_named(extra, epi, msg):
    with pytest.raises(VerifyError, match=msg):
        parse_module(FLUSH.format(extra=extra, epi=epi))


@pytest.mark.parametrize("hidden, inter, dtype, mb", [(4096, 1000, "bf16", 16),
                                                      (4096, 1000, "f16", 64),
                                                      (512, 328, "f32", 4),
                                                      (1003, 500, "f16", 8),
                                                      (4096, 1000, "bf16", 1)])
def test_each_path_with_a_norm_prologue_compiles(hidden, inter, dtype, mb):
    """tensor cores (16-bit, 1-128 rows), FMA (f32) and plain loads (rows TMA cannot copy), chained and
    not, without spills."""
    from fusionc.codegen.compile import compile_kernel
    m = run_pipeline(Module((example("graphs_v2", hidden=hidden, inter=inter,
                                     dtype=dtype)["mlp"],)), v2_pipeline(mb))
    for k in kernels(m):
        ck = compile_kernel(k)
        assert ck.spills == 0 and ck.cubin


WG, SYNC = "fc_acc_wgmma_smem", "fc_acc_mma_smem"


@pytest.mark.parametrize("dtype, mb, forced, fn", [("f16", 16, "", WG), ("f16", 1, "sync", SYNC),
                                                   ("bf16", 17, "", WG), ("f16", 64, "", WG),
                                                   ("f16", 64, "sync", SYNC),
                                                   ("bf16", 1, "wgmma", WG)])
def test_tensor_cores_issue_wgmma_from_the_measured_batch(dtype, mb, forced, fn, monkeypatch):
    """The tensor-core path's consumer: a warpgroup's wgmma from 1 row, mma.sync
    when FUSIONC_MMA=sync asks for it (up to 64 rows), the norm prologue in place on the
    activation box, compiled without ptxas serializing the wgmma (C7520) or spilling."""
    from fusionc.codegen.compile import compile_kernel
    monkeypatch.setenv("FUSIONC_MMA", forced)
    m = run_pipeline(Module((example("graphs_v2", hidden=1000, inter=520,
                                     dtype=dtype)["mlp"],)), v2_pipeline(mb))
    for k in kernels(m):
        ck = compile_kernel(k)
        assert fn + "<" in ck.source.source
        assert "C7520" not in ck.log and ck.spills == 0


@pytest.mark.parametrize("forced, mb, msg", [("SYNC", 4, "FUSIONC_MMA='SYNC'"),
                                             ("sync", 128, "FUSIONC_MMA=sync at max_batch 128")])
def test_an_mma_override_the_path_cannot_follow_is_named(forced, mb, msg, monkeypatch):
    from fusionc.codegen.compile import compile_kernel
    monkeypatch.setenv("FUSIONC_MMA", forced)
    with pytest.raises(CompileError, match=re.escape(msg)):
        m = run_pipeline(Module((example("graphs_v2", hidden=1000, inter=520)["mlp"],)),
                         v2_pipeline(mb))
        compile_kernel(kernels(m)[0])


@pytest.mark.parametrize("extra, epi, msg", [
    (", %y", "add", "add operand %y"),
    (", %acc", "add", "add operand %acc"),
])
def test_flush_operands_are_kernel_inputs(extra, epi, msg):
    with pytest.raises(VerifyError, match=msg):
        parse_module(FLUSH.format(extra=extra, epi=epi))


def test_row_rms_checks_its_eps_and_input():
    text = FLUSH.format(extra="", epi="").replace(
        "  %acc = acc_alloc()", "  %r = row_rms(%x) {eps = -1.0} : f32[B]\n  %acc = acc_alloc()")
    with pytest.raises(VerifyError, match="eps = -1.0"):
        parse_module(text)
    with pytest.raises(VerifyError, match="row_rms of %y"):
        parse_module(text.replace("row_rms(%x) {eps = -1.0}", "row_rms(%y) {eps = 1e-05}"))


def test_silu_mul_needs_paired_tiles():
    with pytest.raises(VerifyError, match="silu_mul exactly when the tiles are paired"):
        parse_module(FLUSH.format(extra="", epi="silu_mul"))


def test_outlier_activations_are_normed_before_rounding():
    """x · r · gamma is rounded, as rms_norm rounds its output: an f16 outlier (3000 · 25) that
    the norm brings back into range must not overflow."""
    @fc.graph
    def g(x: fc.f16["B", 256], s: fc.f16[256], w: fc.f16[64, 256]):
        return fc.linear(fc.rms_norm(x, s, 1e-5, name="h"), w, name="y")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 256))
    x[:, 7] = 3000
    s = 1 + 0.1 * rng.standard_normal(256)
    s[7] = 25
    args = {"x": x, "s": s, "w": rng.standard_normal((64, 256)) / 16}
    out, = simulate(run_pipeline(g, v2_pipeline(2)), args)
    ref, = interpret(g, args)
    assert np.isfinite(out).all() and rel_err(out, ref) <= 1e-2


def test_a_cast_keeps_the_rounding_to_the_16_bit_dtype():
    m = run_pipeline(example("graphs_v2", hidden=256, inter=200), v2_pipeline(2, chain=True))
    flush = phases(m["chain_k0"])[-1].regions[0][-1]   # the second linear: the chain's phase 2
    assert flush.attr("epilogue") == "round_bf16" and flush.operands[1].type.dtype.value == "f32"


def test_a_split_along_the_batch_is_not_a_gate_up_pair():
    @fc.graph
    def g(x: fc.f16[4, 64], w: fc.f16[64, 64]):
        a, b = fc.split(fc.linear(x, w, name="y"), [2, 2], axis=0, name=("a", "b"))
        return fc.silu_mul(a, b)
    with pytest.raises(LoweringError, match="'split'.*not lowered by lowering v2"):
        run_pipeline(g, v2_pipeline(4))


def test_the_epilogue_rounds_where_the_graph_rounds():
    """linear → + t in f16: the linear's result overflows f16 (30 · 40 · 64 = 76800) in the
    graph, so the sum is inf there; the fused flush must round it first too."""
    @fc.graph
    def g(x: fc.f16["B", 64], w: fc.f16[64, 64], t: fc.f16["B", 64]):
        return fc.linear(x, w, name="y") + t
    args = {"x": np.full((1, 64), 30.0), "w": np.full((64, 64), 40.0),
            "t": np.full((1, 64), -60000.0)}
    out, = simulate(run_pipeline(g, v2_pipeline(1)), args)
    ref, = interpret(g, args)
    assert np.isinf(ref).all() and np.array_equal(out, ref)


@pytest.mark.parametrize("dtype, hidden, top", [("f16", 256, 128), ("bf16", 256, 128),
                                                ("f32", 256, 16), ("f16", 1003, 16)])
def test_the_batch_bucket_is_named_past_its_limit(dtype, hidden, top):
    """Tensor cores hold 128 rows; the FMA paths (f32, rows TMA cannot copy: 1003 f16) 16."""
    from fusionc.lower.linear_v2 import fused_rows, max_rows
    assert max_rows(fc.ir.DType(dtype), hidden) == top
    g = example("graphs_v2", hidden=hidden, inter=200, dtype=dtype)
    assert fused_rows(g["mlp"]) == top
    run_pipeline(Module((g["mlp"],)), v2_pipeline(top))
    with pytest.raises(LoweringError, match=f"at most {top} rows per fused kernel"):
        run_pipeline(Module((g["mlp"],)), v2_pipeline(top + 1))


@pytest.mark.parametrize("graph, batch, mb, chain", [("mlp", 33, 64, True), ("mlp", 64, 64, False),
                                                     ("chain", 17, 32, True),
                                                     ("mlp", 100, 128, True)])
def test_tensor_cores_take_up_to_128_rows_like_the_interpreter(graph, batch, mb, chain):
    m = example("graphs_v2", hidden=256, inter=200, dtype="bf16")
    g = Module((m[graph],))
    args = inputs(m[graph], batch, [], np.random.default_rng(batch))
    out, = simulate(run_pipeline(g, v2_pipeline(mb, chain=chain)), args)
    ref, = interpret(g, args)
    assert rel_err(out, ref) <= 1e-2


def test_the_default_takes_the_library_path_past_the_fused_bucket():
    """fusionc.compile(lowering = 'v2'): fused kernels up to fused_rows unless the cost table
    measured the library path faster at that batch (from 33 rows on an H200), GEMMs above;
    128-row tiles where it measured them fastest (1-32 rows) and every linear is on tensor
    cores, 64-row tiles on the FMA paths."""
    from fusionc.cost.h200 import H200
    from fusionc.runtime.pipelines import v2_default_pipeline
    m = example("graphs_v2", hidden=256, inter=200, dtype="f16")
    assert v2_default_pipeline(m["mlp"], 32).startswith("fold-views,fuse-allreduce-norm,partition-units")
    assert [H200.v2_path(r) for r in (1, 8, 32, 33, 128, 129)] == \
        ["wide", "wide", "wide", "library", "library", None]
    assert "rows=128" in v2_default_pipeline(m["mlp"], 1)
    assert "chain=false" not in v2_default_pipeline(m["mlp"], 1)
    assert v2_default_pipeline(m["mlp"], 33).endswith("lower-library")
    assert v2_default_pipeline(m["mlp"], 129).endswith("lower-library")
    f32 = v2_default_pipeline(example("graphs_v2", hidden=256, inter=200, dtype="f32")["mlp"], 16)
    assert f32.startswith("fold-views,fuse-allreduce-norm,partition-units") and "rows=" not in f32
    low = run_pipeline(Module((m["chain"],)), v2_default_pipeline(m["chain"], 200))
    assert [op.name for op in low["chain"].body] == ["library_call", "library_call", "cast"]
    assert len(low["chain"].body[0].operands) == 3   # the bias, added by the GEMM


def test_the_cost_of_a_phased_kernel_counts_every_phase():
    from fusionc.cost.model import streamed_cost
    m = run_pipeline(Module((example("graphs_v2", hidden=256, inter=200)["mlp"],)),
                     v2_pipeline(16))
    k, = kernels(m)
    weights = (2 * 200 * 256 + 256 * 200) * 2
    c = streamed_cost(k, batch=1)
    assert weights < c.global_bytes < weights + 4096 and c.flops == 2 * (400 * 256 + 256 * 200)


def test_the_default_counts_static_rows_and_split_tokens():
    """A static batch past the bucket takes the library path whatever max_batch says, and
    split_tokens (the token-split overlap of the library path) is passed on."""
    from fusionc.runtime.pipelines import v2_default_pipeline

    @fc.graph
    def g(x: fc.f16[200, 256], w: fc.f16[64, 256], b: fc.f16[64]):
        return fc.linear(x, w, b, name="y")
    assert v2_default_pipeline(g.graphs[0], 8).endswith("lower-library")
    chain = example("graphs_v2", hidden=256, inter=200)["chain"]
    pipe = v2_default_pipeline(chain, 4, 2)
    assert "split-tokens{parts=2" in pipe
    low = run_pipeline(Module((chain,)), pipe.replace("min_tokens=4096", "min_tokens=1"))
    calls = [op for op in low["chain"].body if op.name == "library_call"]
    assert len(calls) == 4 and sum(len(op.operands) == 3 for op in calls) == 2   # h, per block


@pytest.mark.parametrize("graph, batch, mb, chain", [("mlp", 33, 64, True), ("mlp", 100, 128, False),
                                                     ("chain", 17, 32, True), ("swiglu", 5, 8, True),
                                                     ("norm_silu", 2, 2, True)])
def test_wide_tiles_simulate_like_the_interpreter(graph, batch, mb, chain):
    """partition-units{rows = 128}: one warpgroup per 64 weight rows over whole chunks."""
    m = example("graphs_v2", hidden=256, inter=200, dtype="bf16")
    g = Module((m[graph],))
    args = inputs(m[graph], batch, [], np.random.default_rng(batch))
    low = run_pipeline(g, v2_pipeline(mb, chain=chain, rows=128))
    assert {op.attr("rows") for k in kernels(low) for op in k.walk() if op.name == "acc_gemv"} \
        == {128}
    out, = simulate(low, args)
    ref, = interpret(g, args)
    assert rel_err(out, ref) <= 1e-2


@pytest.mark.parametrize("graph, mb", [("mlp", 64), ("linear", 128), ("swiglu", 4)])
def test_wide_tiles_compile_without_spills(graph, mb):
    from fusionc.codegen.compile import compile_kernel
    m = run_pipeline(Module((example("graphs_v2", hidden=1000, inter=520)[graph],)),
                     v2_pipeline(mb, rows=128))
    for k in kernels(m):
        ck = compile_kernel(k)
        assert f"fc_acc_wgmma_smem<{-(-mb // 8)}, 128," in ck.source.source
        assert "C7520" not in ck.log and ck.spills == 0


def test_wide_tiles_off_the_wgmma_path_are_named(monkeypatch):
    from fusionc.errors import PassError
    m = example("graphs_v2", hidden=256, inter=200, dtype="f32")
    with pytest.raises(LoweringError, match="tiles of 128 weight rows"):
        run_pipeline(Module((m["mlp"],)), v2_pipeline(4, rows=128))
    with pytest.raises(PassError, match="rows = 100"):
        run_pipeline(Module((m["mlp"],)), "partition-units{max_batch=4, rows=100}")
    monkeypatch.setenv("FUSIONC_MMA", "sync")
    f16 = example("graphs_v2", hidden=256, inter=200, dtype="f16")
    with pytest.raises(CompileError, match="tiles of 128 rows on the mma.sync path"):
        run_pipeline(Module((f16["mlp"],)), v2_pipeline(4, rows=128))


def test_compile_refuses_lowering_v1_and_an_empty_pipeline_by_name():
    from fusionc.errors import InputError
    m = example("graphs_v2", hidden=256, inter=200)
    for kw in (dict(lowering="v1"), dict(lowering="v3"), dict(pipeline=""),
               dict(pipeline=" "), dict(cluster=4), dict(scheme="splitn")):
        with pytest.raises(InputError, match="lowering = 'v[13]'|pipeline = ''|"
                                             "cluster = 4|scheme = 'splitn'") as e:
            fc.compile(m, "mlp", max_batch=4, **kw)
        assert e.value.valid


def test_a_rank_1_x_is_named_by_the_linear_on_the_default():
    """K of a rank-1 x is not a static batch: the v2 default keeps the fused pipeline, whose
    lowering names the linear's shape."""
    @fc.graph
    def g(x: fc.bf16[256], w: fc.bf16[512, 256]):
        return fc.linear(x, w, name="y")
    with pytest.raises(LoweringError, match=r"linear on x bf16\[256\]"):
        fc.compile(g, max_batch=4, lowering="v2")


def test_ops_no_fused_kernel_takes_send_the_default_to_the_library_path():
    """fusionc.compile(lowering = 'v2') compiles graphs the fused kernels do not cover yet
    (elementwise ops without a linear, one before a linear, a norm with other uses, a feature
    split) on the library path; ops the library cannot run stay named by partition-units."""
    @fc.graph
    def eltwise(x: fc.f16["B", 256], y: fc.f16["B", 256], n: fc.f16[256]):
        return fc.silu(fc.rms_norm(x, n, 1e-5)) * y + x

    @fc.graph
    def split_only(x: fc.f16["B", 256]):
        a, b = fc.split(x, [128, 128], axis=1)
        return fc.cast(fc.silu_mul(a, b), "f32")

    @fc.graph
    def before(x: fc.f16["B", 64], w: fc.f16[64, 64]):
        return fc.linear(fc.silu(x), w, name="y")

    @fc.graph
    def shared_norm(x: fc.f16["B", 64], s: fc.f16[64], w: fc.f16[64, 64]):
        h = fc.rms_norm(x, s, 1e-5, name="h")
        return fc.linear(h, w, name="y") + h
    for g, ops in ((eltwise, ["rms_norm", "silu", "mul", "add"]),
                   (split_only, ["split", "silu_mul", "cast"]),
                   (before, ["silu", "library_call"]),
                   (shared_norm, ["rms_norm", "library_call", "add"])):
        fn = fc.compile(g, max_batch=4, lowering="v2")
        assert [op.name for op in fn.host.body] == ops and not fn.kernels
    fused = fc.compile(example("graphs_v2", hidden=256, inter=200)["mlp"], max_batch=4,
                       lowering="v2")
    assert fused.kernels


@pytest.mark.parametrize("stages", [0, 1, 17])
def test_a_ring_depth_out_of_range_is_named_by_stream_plan(stages):
    from fusionc.errors import PassError
    m = example("graphs_v2", hidden=256, inter=200)
    with pytest.raises(PassError, match=f"'stream-plan'.*stages = {stages}"):
        run_pipeline(Module((m["mlp"],)), f"partition-units{{max_batch=4}},"
                     f"stream-plan{{stages={stages}}},insert-barriers,smem-plan")
