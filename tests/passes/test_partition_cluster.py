"""partition-cluster: simulate(lower(g)) matches interpret(g) over random configurations, and
the lowered IR of the Llama examples keeps its shape (filecheck)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filecheck import filecheck
from fusionc.errors import LoweringError
from fusionc.interp import interpret
from fusionc.ir import Module, parse_module, print_module
from fusionc.passes import run_pipeline
from fusionc.sim import simulate
from tests.passes.graphs import example, inputs, rel_err

TOL = {"f16": 1e-2, "bf16": 2e-2, "f32": 1e-4}


@st.composite
def attention_configs(draw):
    size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    kv_heads, group = draw(st.sampled_from([(1, 1), (2, 1), (1, 4), (2, 24), (2, 2)]))
    head_dim = draw(st.sampled_from([64, 128, 256]))
    hidden = size * draw(st.sampled_from([4, 8, 12, 16]))
    batch = draw(st.integers(1, 8))
    max_seq = draw(st.integers(1, 40))
    lens = draw(st.lists(st.integers(0, max_seq), min_size=batch, max_size=batch))
    return dict(
        size=size,
        kv_heads=kv_heads,
        heads=kv_heads * group,
        head_dim=head_dim,
        hidden=hidden,
        batch=batch,
        max_seq=max_seq,
        lens=lens,
        qk_norm=draw(st.booleans()),
        scheme=draw(st.sampled_from(["splitk", "splitn"])),
        dtype=draw(st.sampled_from(["f16", "bf16"])),
        seed=draw(st.integers(0, 2**16)),
    )


def _attention_graph(c):
    if c["qk_norm"]:
        m = example(
            "qwen3_qk_norm",
            hidden=c["hidden"],
            heads=c["heads"],
            kv_heads=c["kv_heads"],
            head_dim=c["head_dim"],
            intermediate=64,
            max_seq=c["max_seq"],
            dtype=c["dtype"],
        )
    else:
        m = example(
            "llama3_8b",
            hidden=c["hidden"],
            heads=c["heads"],
            kv_heads=c["kv_heads"],
            head_dim=c["head_dim"],
            intermediate=64,
            max_seq=c["max_seq"],
            dtype=c["dtype"],
        )
    return m


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attention_configs())
def test_attention_block_lowering_matches_interpreter(c):
    m = _attention_graph(c)
    pipeline = f"partition-cluster{{size={c['size']},scheme={c['scheme']},max_batch={c['batch']}}}"
    try:
        low = run_pipeline(m, pipeline)
    except LoweringError as e:  # e.g. 24 query heads x 256 dims x 8 rows: over 227 KB
        assert "shared memory per CTA" in str(e), e
        return
    assert parse_module(print_module(low)) == low
    g = m["attention"]
    args = inputs(g, c["batch"], c["lens"], np.random.default_rng(c["seed"]))
    ref = interpret(g, args)
    out = simulate(low, args, graph="attention")
    for o, r in zip(out, ref):
        assert rel_err(o, r) <= TOL[c["dtype"]], c


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.sampled_from([1, 2, 4, 8, 16]),
    hidden_mult=st.integers(1, 4),
    inter=st.sampled_from([64, 96, 128, 192]),
    batch=st.integers(1, 8),
    dtype=st.sampled_from(["f16", "bf16"]),
    seed=st.integers(0, 2**16),
    scheme=st.sampled_from(["splitn", "splitk"]),
)
def test_mlp_block_lowering_matches_interpreter(size, hidden_mult, inter, batch, dtype, seed,
                                                scheme):
    hidden = 16 * size * hidden_mult
    m = example(
        "llama2_7b",
        hidden=hidden,
        heads=1,
        head_dim=hidden,
        intermediate=inter,
        max_seq=4,
        dtype=dtype,
    )
    try:
        low = run_pipeline(Module((m["mlp"],)),
                           f"partition-cluster{{size={size},scheme={scheme}}}")
    except LoweringError as e:  # no grid divides the intermediate size for this C
        assert "dividing the intermediate size" in str(e) or "divisible" in str(e) \
            or "no cluster configuration" in str(e), e
        return
    g = m["mlp"]
    args = inputs(g, batch, [1] * batch, np.random.default_rng(seed))
    assert rel_err(simulate(low, args, graph="mlp")[0], interpret(g, args)[0]) <= TOL[dtype]


def test_empty_rows_give_zero_attention():
    """seq_len 0 rows and more splits than tokens: zeros, no NaN (known failure classes)."""
    m = example(
        "llama3_8b",
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=64,
        intermediate=64,
        max_seq=8,
        dtype="f16",
    )
    low = run_pipeline(m, "partition-cluster{size=8,scheme=splitk}")
    args = inputs(m["attention"], 4, [5, 0, 1, 8], np.random.default_rng(0))
    out = simulate(low, args, graph="attention")
    ref = interpret(m["attention"], args)
    assert not np.isnan(out[0]).any()
    assert rel_err(out[0], ref[0]) <= 1e-2
    # row 1 attends over nothing: its new hidden state is x + o_proj(0) = x
    np.testing.assert_allclose(out[0][1], args["x"][1].astype(np.float16), rtol=2e-3, atol=2e-3)


def test_llama2_golden_ir():
    low = run_pipeline(example("llama2_7b"), "partition-cluster{size=4,scheme=splitk}")
    filecheck(
        print_module(low),
        """
        CHECK: kernel @attention_k0 {grid = 32, cluster = 4, threads = 256
        CHECK: load(%x) {offsets = ["0", "1024*rank"], sizes = [B, 1024]
        CHECK: reduce({{%\\w+}}) {op = sumsq
        CHECK: cluster_reduce({{%\\w+}}) {op = sum
        CHECK: norm_apply
        CHECK: gemv({{%\\w+}}, %w_qkv) {row = "128*cluster", col = "1024*rank", rows = 128
        CHECK: gemv({{%\\w+}}, %w_qkv) {row = "128*cluster + 4096"
        CHECK: gemv({{%\\w+}}, %w_qkv) {row = "128*cluster + 8192"
        CHECK: cluster_reduce({{%\\w+}}) {op = sum
        CHECK: rope
        CHECK: when() {on = rank, lo = 0, hi = 1}
        CHECK-NEXT: kv_append(%k_cache
        CHECK: attn_partial
        CHECK: cluster_reduce({{%\\w+}}) {op = max
        CHECK: attn_rescale
        CHECK: cluster_reduce({{%\\w+}}) {op = sum
        CHECK: attn_finish
        CHECK: gemv({{%\\w+}}, %w_o) {row = "1024*rank", col = "128*cluster", rows = 1024
        CHECK: grid_reduce
        CHECK: graph @attention
        CHECK-NEXT: launch
        CHECK: graph @mlp
        CHECK-NEXT: rms_norm
    """,   # the MLP is left to partition-units (design v2's linears)
    )


def test_llama3_golden_ir():
    low = run_pipeline(example("llama3_8b"), "partition-cluster{size=8,scheme=splitn}")
    filecheck(
        print_module(low),
        """
        CHECK: kernel @attention_k0 {grid = 8, cluster = 8
        CHECK: rms_norm
        CHECK: gemv({{%\\w+}}, %w_qkv) {row = "512*cluster + 64*rank", col = "0", rows = 64
        CHECK: gemv({{%\\w+}}, %w_qkv) {row = "128*cluster + 16*rank + 4096"
        CHECK: cluster_gather({{%\\w+}}) {axis = 1} : f32[B, 768]
        CHECK: attn_partial({{.*}}) {kv_head = "cluster", part = "rank", parts = 8{{.*}}: f32[B, 4], f32[B, 4], f32[B, 4, 128]
        CHECK: grid_reduce
        CHECK: graph @attention
    """,
    )


def test_cost_model_chooses_a_configuration():
    low = run_pipeline(
        example("llama2_7b", hidden=512, heads=4, head_dim=128, intermediate=1024),
        "partition-cluster",
    )
    kernels = [g for g in low.graphs if g.kind == "kernel"]
    assert [k.name for k in kernels] == ["attention_k0"]   # the MLP: partition-units
    assert all(k.attr("cluster") in (1, 2, 4, 8, 16) for k in kernels)


@pytest.mark.parametrize(
    "pipeline,msg",
    [
        ("partition-cluster{size=3}", "cluster size 3"),
        ("partition-cluster{scheme=diag}", "scheme diag"),
        ("partition-cluster{max_batch=0}", "max_batch = 0"),
        ("partition-cluster{group=2}", "has no option 'group'"),   # MLA's, deleted with v1's MLA
        ("partition-cluster{size=x}", "option size=x"),
        ("partition-cluster{colour=1}", "has no option 'colour'"),
        ("partition-clusters", "unknown pass 'partition-clusters'"),
        ("partition-cluster,,fuse", "bad pipeline"),
    ],
)
def test_bad_pipelines(pipeline, msg):
    with pytest.raises(Exception, match=msg) as e:
        run_pipeline(
            example("llama2_7b", hidden=64, heads=1, head_dim=64, intermediate=64), pipeline
        )
    assert type(e.value).__module__ == "fusionc.errors"


def test_cluster_size_that_cannot_divide_is_explained():
    m = example("llama2_7b", hidden=48, heads=1, head_dim=48, intermediate=64)
    with pytest.raises(
        LoweringError,
        match=r"hidden = 48 is not divisible by the cluster size 32"
        r"|cluster size 32",
    ) as e:
        run_pipeline(m, "partition-cluster{size=32}")
    assert "valid" in str(e.value)


def test_an_mlp_is_left_to_partition_units():
    """v1 has no MLP kernel of its own: partition-cluster leaves the block, its pipeline's
    partition-units makes design v2's streamed kernels of it."""
    from fusionc.passes.pipeline import default_pipeline
    m = Module((example("llama2_7b")["mlp"],))
    assert run_pipeline(m, "partition-cluster{max_batch=16},fuse") == m
    low = run_pipeline(m, default_pipeline(max_batch=16))
    assert [op.name for op in low["mlp"].body] == ["launch"]   # chained above 8 rows
