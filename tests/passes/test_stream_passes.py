"""Design-v2 passes (fusionc.passes.stream), one small before/after check each, and
simulate(lower(g)) ≈ interpret(g) over random linear layers (hypothesis); every v2 path
compiles with NVRTC."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fusionc as fc
from tests.passes.graphs import linear_graph
from fusionc.errors import LoweringError
from fusionc.interp import interpret
from fusionc.ir import Module
from fusionc.passes import run_pipeline
from fusionc.passes.stream import v2_pipeline
from fusionc.sim import simulate


def names(m: Module, kernel: str = "lin_k0") -> list[str]:
    units = next(op for op in m[kernel].body if op.name == "units")
    return [op.name for op in m[kernel].body] + ["|"] + [op.name for op in units.regions[0]]


def test_partition_units_cuts_the_weight_into_tiles():
    m = run_pipeline(linear_graph(200, 300), "partition-units{max_batch=4}")
    assert names(m) == ["acc_alloc", "units", "|", "acc_gemv", "group_flush"]
    units = m["lin_k0"].body[1]
    assert (units.attr("count"), units.attr("group")) == (4 * 3, 3)   # ⌈200/64⌉ x ⌈300/128⌉
    assert [op.name for op in m["lin"].body] == ["launch"]


def test_stream_plan_puts_tiles_on_a_ring_without_waits():
    m = run_pipeline(linear_graph(200, 256), "partition-units{max_batch=4},stream-plan")
    assert names(m) == ["acc_alloc", "ring_alloc", "units", "|", "ring_issue", "ring_stage",
                        "acc_gemv", "ring_release", "group_flush"]
    assert m["lin_k0"].attr("threads") == 288   # the producer warp


def test_stream_plan_keeps_rows_tma_cannot_copy_on_plain_loads():
    m = run_pipeline(linear_graph(64, 1003), "partition-units{max_batch=2},stream-plan")
    assert "ring_alloc" not in names(m)


def test_insert_barriers_adds_the_ring_waits():
    m = run_pipeline(linear_graph(200, 256), "partition-units{max_batch=4},stream-plan,insert-barriers")
    assert names(m)[3:] == ["|", "ring_claim", "ring_issue", "ring_stage", "ring_wait",
                            "acc_gemv", "ring_release", "group_flush"]


@pytest.mark.parametrize("mb, stages", [(1, 4), (16, 4)])
def test_smem_plan_sizes_the_ring(mb, stages):
    m = run_pipeline(linear_graph(4096, 4096), v2_pipeline(mb))
    ring = next(op for op in m["lin_k0"].body if op.name == "ring_alloc")
    assert ring.result.type.shape[0] == stages
    m = run_pipeline(linear_graph(4096, 4096), v2_pipeline(mb).replace("smem-plan",
                                                                 "smem-plan{max_stages=16}"))
    from fusionc.codegen.streamed import plan
    assert plan(m["lin_k0"]).smem <= 227 * 1024


def test_other_ops_are_refused_by_name():
    @fc.graph
    def g(x: fc.f16["B", 64], w: fc.f16[64]):
        return fc.rms_norm(x, w, 1e-5)
    with pytest.raises(LoweringError, match="rms_norm"):
        run_pipeline(g, v2_pipeline(2))


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 300), k=st.sampled_from([8, 64, 120, 128, 136, 384, 1000, 1003]),
       dtype=st.sampled_from(["f16", "bf16", "f32"]), batch=st.integers(1, 5),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_simulator_matches_interpreter(n, k, dtype, batch, bias, seed):
    g = linear_graph(n, k, dtype, bias)
    low = run_pipeline(g, v2_pipeline(batch))
    rng = np.random.default_rng(seed)
    args = {"x": rng.standard_normal((batch, k)), "w": rng.standard_normal((n, k)) / np.sqrt(k)}
    if bias:
        args["b"] = rng.standard_normal(n)
    ref, = interpret(g, args)
    out, = simulate(low, args)
    err = np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref)
    assert err <= (1e-5 if dtype == "f32" else 1e-2)


@pytest.mark.parametrize("n, k, dtype, mb", [(4096, 4096, "f16", 1), (1000, 4104, "bf16", 16),
                                             (200, 520, "f32", 4), (300, 1003, "f16", 8)])
def test_every_path_compiles(n, k, dtype, mb):
    from fusionc.codegen.compile import compile_kernel
    m = run_pipeline(linear_graph(n, k, dtype), v2_pipeline(mb))
    ck = compile_kernel(m["lin_k0"])
    assert ck.spills == 0 and ck.cubin


def test_static_batch_above_the_bucket_sizes_the_kernel():
    @fc.graph
    def g(x: fc.f16[12, 256], w: fc.f16[100, 256]):
        return fc.linear(x, w, name="y")
    low = run_pipeline(g, v2_pipeline(8))
    rng = np.random.default_rng(3)
    args = {"x": rng.standard_normal((12, 256)), "w": rng.standard_normal((100, 256)) / 16}
    ref, = interpret(g, args)
    out, = simulate(low, args)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-2
    assert low["g_k0"].attr("max_batch") == 12


def test_weights_computed_in_the_graph_are_refused():
    @fc.graph
    def g(x: fc.f16["B", 64], a: fc.f16[8, 64], b: fc.f16[64, 64]):
        return fc.linear(x, fc.linear(a, b, name="w"), name="y")
    with pytest.raises(LoweringError, match="computed in the graph"):
        run_pipeline(g, v2_pipeline(2))


def test_codegen_refuses_a_ring_without_its_waits():
    from fusionc.codegen.compile import compile_kernel
    from fusionc.errors import CompileError
    m = run_pipeline(linear_graph(128, 256), "partition-units{max_batch=2},stream-plan,smem-plan")
    with pytest.raises(CompileError, match="ring_claim"):
        compile_kernel(m["lin_k0"])


def test_kernel_names_do_not_clash_with_graphs():
    lin = linear_graph(64, 128)
    other = lin.graphs[0].replace(name="lin_k0")
    m = run_pipeline(Module((lin.graphs[0], other)), v2_pipeline(2))
    assert len(set(m.names)) == len(m.names)


@pytest.mark.parametrize("spec, match", [
    ("partition-units{chain=true,chain=false}", "option 'chain' of pass 'partition-units' "
                                                "given twice"),
    ("partition-units{max_batch=0}", "max_batch >= 1"),
    ("partition-units{grid=-1}", "grid >= 0"),
    ("smem-plan{max_stages=1}", "2 to 16 stages"),
])
def test_bad_pass_options_are_named_when_the_pipeline_is_read(spec, match):
    from fusionc.errors import PassError
    from fusionc.passes.pipeline import parse_pipeline
    with pytest.raises(PassError, match=match):
        parse_pipeline(spec)


def test_empty_option_braces_mean_no_options():
    from fusionc.passes.pipeline import parse_pipeline
    assert [p.name for p in parse_pipeline("fold-views{},smem-plan{}")] == ["fold-views",
                                                                         "smem-plan"]


@pytest.mark.parametrize("pipeline, first", [
    ("stream-plan,partition-units{max_batch=2}", "stream-plan"),
    ("fold-views,partition-units{max_batch=2},smem-plan,stream-plan", "smem-plan"),
    ("partition-units{max_batch=2},insert-barriers,stream-plan", "insert-barriers")])
def test_a_pass_before_the_passes_it_requires_is_named(pipeline, first):
    """On graph IR these passes would do nothing (no kernels yet) or fail on what no earlier
    pass made: the pipeline is refused before any pass runs, naming the pass."""
    from fusionc.errors import PassError
    with pytest.raises(PassError, match=f"{first} with no") as e:
        run_pipeline(linear_graph(128, 256), pipeline)
    assert e.value.op == first and "earlier in the pipeline" in str(e.value)
