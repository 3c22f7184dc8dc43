"""partition-cluster on multi-head latent attention (examples/deepseek_v2_lite.py):
simulate(lower(g)) matches interpret(g) over random sizes, cluster sizes and heads per cluster;
the lowered kernel has the collectives the design names (filecheck); bad blocks are explained."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fusionc as fc
from filecheck import filecheck
from fusionc.errors import FusionError, LoweringError
from fusionc.interp import interpret
from fusionc.ir import parse_module, print_module
from fusionc.passes import run_pipeline
from fusionc.sim import simulate
from tests.passes.graphs import example, inputs, rel_err

TOL = {"f16": 1e-2, "bf16": 2e-2, "f32": 1e-4}
INFEASIBLE = ("rows over", "not divisible", "shared memory", "resident")


@st.composite
def mla_configs(draw):
    size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    heads = draw(st.sampled_from([1, 2, 4]))
    batch = draw(st.integers(1, 4))
    max_seq = draw(st.integers(1, 40))
    return dict(
        size=size, heads=heads,
        group=draw(st.sampled_from([g for g in (1, 2, 4) if heads % g == 0])),
        sizes=dict(hidden=16 * draw(st.integers(1, 3)), heads=heads,
                   qk_nope=draw(st.sampled_from([16, 32])), qk_rope=16,
                   v_head=draw(st.sampled_from([16, 32])), kv_lora=16 * draw(st.integers(1, 3)),
                   max_seq=max_seq),
        batch=batch, lens=draw(st.lists(st.integers(0, max_seq), min_size=batch,
                                        max_size=batch)),
        dtype=draw(st.sampled_from(["f16", "bf16", "f32"])), seed=draw(st.integers(0, 2**16)),
        extra=draw(st.integers(0, 3)))   # clusters that only take attention work units


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mla_configs())
def test_mla_block_lowering_matches_interpreter(c):
    m = example("deepseek_v2_lite", **c["sizes"], dtype=c["dtype"])
    g = m["attention"]
    pipeline = (f"partition-cluster{{size={c['size']},max_batch={c['batch']}}}")
    try:
        low = run_pipeline(m, pipeline)
    except LoweringError as e:   # e.g. more rows than CTAs, a grid too large to be resident
        assert any(t in str(e) for t in INFEASIBLE), e
        return
    assert parse_module(print_module(low)) == low
    args = inputs(g, c["batch"], c["lens"], np.random.default_rng(c["seed"]))
    ref = interpret(g, args)
    out = simulate(low, args, graph="attention")
    for o, r in zip(out, ref):
        assert rel_err(o, r) <= TOL[c["dtype"]], c


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mla_configs())
def test_every_heads_per_cluster_matches_interpreter(c):
    """The cost model picks the group above; here each (cluster size, group) is forced."""
    from fusionc.ir import Module
    from fusionc.lower.match import Dataflow
    from fusionc.lower.match_mla import match_mla
    from fusionc.lower.mla import lower_mla
    m = example("deepseek_v2_lite", **c["sizes"], dtype=c["dtype"])
    g = m["attention"]
    att = next(op for op in g.body if op.name == "mla_decode_attention")
    try:
        k = lower_mla(match_mla(Dataflow(g), att), "k", c["size"], c["group"], c["batch"],
                      c["heads"] // c["group"] + c["extra"])
    except LoweringError as e:
        assert any(t in str(e) for t in INFEASIBLE), e
        return
    args = inputs(g, c["batch"], c["lens"], np.random.default_rng(c["seed"]))
    from fusionc.sim import simulate_kernel
    kin = {p.name: args[p.name] if p.name in args
           else np.full(p.type.concrete({"B": c["batch"]}), np.nan) for p in k.params}
    got = simulate_kernel(Module((k,))["k"], kin)
    ref = interpret(g, args)
    out_name = k.outputs[-1].name
    assert rel_err(got[out_name], ref[0]) <= TOL[c["dtype"]], c
    assert rel_err(got["cache"], ref[1]) <= TOL[c["dtype"]], c


def test_deepseek_v2_lite_lowered_ir():
    """One persistent kernel in five phases split by grid barriers: w_q and w_kv_a rows over
    every CTA; per head group the absorbed query (q·W_UK slices gathered), and the new cache row
    built and appended once by a cluster without heads; split-KV attention of one unit per
    CTA; per head group the merge, W_UV (gathered); the output projection rows over every CTA
    with the residual.
    """
    low = run_pipeline(example("deepseek_v2_lite"), "partition-cluster{size=4,max_batch=1}")
    text = print_module(low)
    assert sum(g.kind == "kernel" for g in low.graphs) == 1
    filecheck(text, """
    CHECK: kernel @attention_k0
    CHECK: gemv(%h_{{[0-9]+}}, %w_q)
    CHECK: store(%attention_k0_ws_qr
    CHECK: gemv(%h_{{[0-9]+}}, %w_kv_a)
    CHECK: store(%attention_k0_ws_kv
    CHECK: grid_barrier()
    CHECK: load(%attention_k0_ws_qr)
    CHECK: rope
    CHECK: gemv({{.*}}, %w_uk_t)
    CHECK: cluster_gather
    CHECK: store(%attention_k0_ws_q,
    CHECK: when() {on = cluster, lo = 16, hi = 17}
    CHECK: rms_norm
    CHECK: kv_append(%cache
    CHECK: store(%attention_k0_ws_new
    CHECK: grid_barrier()
    CHECK: load(%attention_k0_ws_new)
    CHECK: mla_attn_unit(%attention_k0_ws_q, %cache
    CHECK: store(%attention_k0_ws_o
    CHECK: grid_barrier()
    CHECK: attn_merge
    CHECK: cluster_gather
    CHECK: gemv({{.*}}, %w_uv)
    CHECK: cluster_gather
    CHECK: store(%attention_k0_ws_ov
    CHECK: grid_barrier()
    CHECK: gemv(%ovx_{{[0-9]+}}, %w_o)
    CHECK: load(%x)
    CHECK: store(%2, %y_res
    CHECK: launch(
    """)


def test_mla_sizes_that_cannot_divide_are_explained():
    m = example("deepseek_v2_lite", hidden=32, heads=2, qk_nope=16, qk_rope=8, v_head=24,
                kv_lora=16, max_seq=8)
    with pytest.raises(FusionError, match="mla_decode_attention.*v_head = 24 is not "
                                          "divisible by the cluster size 16"):
        run_pipeline(m, "partition-cluster{size=16}")


def test_mla_block_without_output_projection_is_explained():
    @fc.graph
    def attention(q_latent: fc.bf16["B", 2, 32], q_rope: fc.bf16["B", 2, 16],
                  cache: fc.bf16["B", 8, 48],
                  positions: fc.i32["B"], seq_lens: fc.i32["B"]):
        return fc.mla_decode_attention(q_latent, q_rope, cache, seq_lens, 0.1)

    with pytest.raises(FusionError, match="latent cache not appended in this graph"):
        run_pipeline(fc.module(attention), "partition-cluster")


SMALL = dict(hidden=64, heads=2, qk_nope=16, qk_rope=16, v_head=16, kv_lora=32, max_seq=8)


@pytest.mark.parametrize("opts,msg", [("group=3", "group = 3"), ("grid=-4", "grid = -4"),
                                      ("max_batch=0", "max_batch = 0")])
def test_bad_partition_options_are_named(opts, msg):
    with pytest.raises(FusionError, match=msg):
        run_pipeline(example("deepseek_v2_lite", **SMALL), f"partition-cluster{{{opts}}}")


def test_block_values_used_outside_the_block_are_explained():
    m = example("deepseek_v2_lite", **SMALL)
    g = m["attention"]
    h = next(v for op in g.body for v in op.results if v.name == "h")
    leaky = g.replace(outputs=g.outputs + (h,))
    with pytest.raises(FusionError, match="%h is computed inside the fused block and also "
                                          "used outside it"):
        run_pipeline(type(m)((leaky,)), "partition-cluster")


def test_work_units_must_number_every_cta_once():
    low = run_pipeline(example("deepseek_v2_lite", **SMALL),
                       "partition-cluster{size=2,grid=3,max_batch=4}")
    text = print_module(low)
    assert 'unit = "2*cluster + rank", units = 6' in text
    for bad in ('unit = "2*cluster + rank", units = 5', 'unit = "cluster + rank", units = 6'):
        with pytest.raises(FusionError, match="numbers every CTA once"):
            parse_module(text.replace('unit = "2*cluster + rank", units = 6', bad))


def test_more_rows_than_work_units_is_a_simulation_error():
    from fusionc.errors import SimulationError
    m = example("deepseek_v2_lite", **SMALL)
    low = run_pipeline(m, "partition-cluster{size=1,group=2,grid=1,max_batch=1}")
    g = m["attention"]
    args = inputs(g, 2, [3, 2], np.random.default_rng(0))
    with pytest.raises(SimulationError, match="batch 2 over 1 work units"):
        simulate(low, args, graph="attention")


def test_random_inputs_fill_latent_caches_to_different_lengths():
    from fusionc.commands.compile import random_inputs
    g = example("deepseek_v2_lite", **SMALL)["attention"]
    a = random_inputs(g, 4, np.random.default_rng(1))
    lens = a["seq_lens"]
    assert lens[0] == 8 and len(set(lens.tolist())) > 1
    assert np.array_equal(a["positions"], lens - 1)
    for b, n in enumerate(lens):
        assert np.isnan(a["cache"][b, n:]).all() and not np.isnan(a["cache"][b, :n]).any()
