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
from fusionc.errors import FusionError
from fusionc.interp import interpret
from fusionc.ir import parse_module, print_module
from fusionc.passes import run_pipeline
from fusionc.sim import simulate
from tests.passes.graphs import example, inputs, rel_err

TOL = {"f16": 1e-2, "bf16": 2e-2, "f32": 1e-4}


@st.composite
def mla_configs(draw):
    size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    heads = draw(st.sampled_from([1, 2, 4]))
    batch = draw(st.integers(1, 4))
    max_seq = draw(st.integers(1, 40))
    return dict(
        size=size, heads=heads, group=draw(st.sampled_from([g for g in (1, 2, 4) if heads % g == 0])),
        sizes=dict(hidden=16 * draw(st.integers(1, 3)), heads=heads,
                   qk_nope=draw(st.sampled_from([16, 32])), qk_rope=16,
                   v_head=draw(st.sampled_from([16, 32])), kv_lora=16 * draw(st.integers(1, 3)),
                   max_seq=max_seq),
        batch=batch, lens=draw(st.lists(st.integers(0, max_seq), min_size=batch,
                                        max_size=batch)),
        dtype=draw(st.sampled_from(["f16", "bf16", "f32"])), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mla_configs())
def test_mla_block_lowering_matches_interpreter(c):
    m = example("deepseek_v2_lite", **c["sizes"], dtype=c["dtype"])
    g = m["attention"]
    pipeline = (f"partition-cluster{{size={c['size']},max_batch={c['batch']}}}")
    low = run_pipeline(m, pipeline)
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
    k = lower_mla(match_mla(Dataflow(g), att), "k", c["size"], c["group"], c["batch"])
    args = inputs(g, c["batch"], c["lens"], np.random.default_rng(c["seed"]))
    from fusionc.sim import simulate_kernel
    kin = {p.name: args.get(p.name, np.full((c["batch"], c["sizes"]["hidden"]), np.nan))
           for p in k.params}
    got = simulate_kernel(Module((k,))["k"], kin)
    ref = interpret(g, args)
    out_name = k.outputs[-1].name
    assert rel_err(got[out_name], ref[0]) <= TOL[c["dtype"]], c
    assert rel_err(got["cache"], ref[1]) <= TOL[c["dtype"]], c


def test_deepseek_v2_lite_lowered_ir():
    """One fused kernel: gathers for q / [c ; k_rope], the latent query (q·W_UK slices) and the
    W_UV output; max and sum reductions for the split-KV merge; the cache append on one CTA;
    the output projection summed over clusters by grid_reduce."""
    low = run_pipeline(example("deepseek_v2_lite"), "partition-cluster{size=4,max_batch=1}")
    text = print_module(low)
    assert sum(g.kind == "kernel" for g in low.graphs) == 1
    filecheck(text, """
    CHECK: kernel @attention_k0
    CHECK: gemv(%h_{{[0-9]+}}, %w_q)
    CHECK: gemv(%h_{{[0-9]+}}, %w_kv_a)
    CHECK: cluster_gather
    CHECK: rms_norm
    CHECK: rope
    CHECK: when() {on = cluster, lo = 0, hi = 1}
    CHECK: kv_append(%cache
    CHECK: gemv({{.*}}, %w_uk_t)
    CHECK: cluster_gather
    CHECK: mla_attn_partial
    CHECK: cluster_reduce({{.*}}) {op = max
    CHECK: cluster_reduce({{.*}}) {op = sum
    CHECK: gemv({{.*}}, %w_uv)
    CHECK: cluster_gather
    CHECK: gemv({{.*}}, %w_o)
    CHECK: grid_reduce
    CHECK: launch(
    """)


def test_mla_sizes_that_cannot_divide_are_explained():
    m = example("deepseek_v2_lite", hidden=32, heads=2, qk_nope=16, qk_rope=8, v_head=16,
                kv_lora=16, max_seq=8)
    with pytest.raises(FusionError, match="mla_decode_attention.*= 24 is not divisible by "
                                          "the cluster size 16"):
        run_pipeline(m, "partition-cluster{size=16}")


def test_mla_block_without_output_projection_is_explained():
    @fc.graph
    def attention(q_latent: fc.bf16["B", 2, 32], q_rope: fc.bf16["B", 2, 16],
                  cache: fc.bf16["B", 8, 48],
                  positions: fc.i32["B"], seq_lens: fc.i32["B"]):
        return fc.mla_decode_attention(q_latent, q_rope, cache, seq_lens, 0.1)

    with pytest.raises(FusionError, match="latent cache not appended in this graph"):
        run_pipeline(fc.module(attention), "partition-cluster")
