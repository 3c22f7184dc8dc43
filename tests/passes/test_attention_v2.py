"""The attention block on lowering v2 (issue 22): what ``partition-units`` makes of it (v2 linears
around one attention-units kernel), the device split plan, ``simulate(lower(g)) ≈ interpret(g)``
over random head configurations, lengths and batches (hypothesis), the default lowering's
choice, named errors, and NVRTC builds of the attention-units kernel."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fusionc.errors import CompileError
from fusionc.interp import interpret
from fusionc.ir import print_module
from fusionc.ir.ops.tile_attn_units import TILE, slots, split_plan
from fusionc.models.blocks import attention_block
from fusionc.passes import run_pipeline
from fusionc.passes.stream import v2_pipeline
from fusionc.sim import simulate
from tests.passes.graphs import example, inputs, rel_err


def UNFUSED(max_batch):
    """The v2 pipeline with the attention units in a kernel of their own."""
    return v2_pipeline(max_batch).replace("}", ", attention_o=false}", 1)


TOL = {"f16": 2e-3, "bf16": 8e-3, "f32": 1e-4}   # 2 units roundoff (f16: 2^-11 · 4, bf16: 2^-8 · 2)


def block(dtype="f16", **kw):
    sizes = dict(hidden=128, heads=4, kv_heads=2, head_dim=32, max_seq=96)
    sizes.update(kw)
    return attention_block(eps=1e-5, theta=1e4, dtype=dtype, **sizes)


def tiny(tail=None, B="B", **rope):
    """A one-KV-head attention block written out in the DSL (hidden 64, 2 query heads,
    head_dim 32, max_seq 80; ``rope``: the rope op's style, rotary_dim, scaling); it returns
    ``tail(y, kc, vc, k_cache, w_n, positions)``, by default (y, kc, vc)."""
    import fusionc as fc

    @fc.graph
    def g(x: fc.f16[B, 64], w_qkv: fc.f16[128, 64], w_o: fc.f16[64, 64], w_n: fc.f16[64],
          k_cache: fc.f16[B, 80, 1, 32], v_cache: fc.f16[B, 80, 1, 32],
          positions: fc.i32[B], seq_lens: fc.i32[B]):
        q, k, v = fc.split(fc.linear(x, w_qkv), [64, 32, 32])
        q = fc.rope(fc.split_heads(q, 2), positions, 1e4, **rope)
        k = fc.rope(fc.split_heads(k, 1), positions, 1e4, **rope)
        kc, vc = fc.kv_cache_append(k_cache, v_cache, k, fc.split_heads(v, 1), positions)
        o = fc.decode_attention(q, kc, vc, seq_lens, 0.2)
        y = x + fc.linear(fc.merge_heads(o), w_o)
        return tail(y, kc, vc, k_cache, w_n, positions) if tail else (y, kc, vc)
    return g


def test_partition_units_makes_qkv_units_and_o_projection_kernels():
    low = run_pipeline(block(), "fold-views,partition-units{max_batch=4, attention_o=false}")
    host = low["attention"]
    assert [op.name for op in host.body] == ["launch"] * 3
    qkv, core, oproj = host.body
    assert [v.name for v in qkv.results] == ["qkv"]
    assert [v.name for v in core.operands] == ["qkv", "k_cache", "v_cache", "positions",
                                               "seq_lens"]
    assert [v.name for v in core.results] == ["o_flat", "k_cache.1", "v_cache.1"]
    assert oproj.operands[0].name == "o_flat"
    k = low[core.attr("kernel").name]
    op, = k.body
    assert op.name == "attn_units" and op.attr("rotary_dim") == 32
    assert [v.name for v in k.outputs] == ["o_flat", "k_cache", "v_cache"]
    text = print_module(low)
    assert "attn_units(%qkv, %k_cache, %v_cache, %positions, %seq_lens, %o_flat)" in text
    for gone in ("rope(", "kv_cache_append(", "decode_attention(", "split("):
        assert gone not in text


def test_qk_norm_weights_join_the_units():
    low = run_pipeline(block(qk_norm=True), "fold-views,partition-units{max_batch=2}")
    op = next(o for g in low.graphs if g.kind == "kernel" for o in g.body
              if o.name == "attn_units")
    assert [v.name for v in op.operands[6:]] == ["q_norm", "k_norm"]
    assert op.attr("eps") == 1e-5


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=40), st.integers(1, 16),
       st.integers(1, 264))
def test_split_plan_covers_every_row_in_equal_chunks_within_the_slots(lens, kvh, grid):
    L, splits = split_plan(lens, kvh, grid, 4096)
    n = np.clip(lens, 0, 4096)
    assert (L % TILE == 0).all() and (splits >= 1).all()
    assert ((splits - 1) * L < np.maximum(n, 1)).all() and (splits * L >= n).all()  # none empty
    assert int(splits.sum()) * kvh <= slots(len(lens), kvh, grid)


CONFIGS = st.fixed_dictionaries({
    "heads_kv": st.sampled_from([(1, 1), (2, 2), (4, 1), (4, 2), (8, 2), (16, 1), (32, 1),
                                 (40, 2)]),   # the last two: groups of 32 and 20, query blocks
    "head_dim": st.sampled_from([16, 32, 48]),
    "qk_norm": st.booleans(),
    "dtype": st.sampled_from(["f16", "bf16", "f32"]),
    "lens": st.lists(st.integers(0, 150), min_size=1, max_size=5),
})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIGS, st.integers(0, 2**31 - 1))
def test_simulate_lowered_attention_matches_interpret(cfg, seed):
    heads, kvh = cfg["heads_kv"]
    m = block(cfg["dtype"], heads=heads, kv_heads=kvh, head_dim=cfg["head_dim"],
              hidden=64, max_seq=150, qk_norm=cfg["qk_norm"])
    rng = np.random.default_rng(seed)
    lens = cfg["lens"]
    args = inputs(m.graphs[0], len(lens), lens, rng)
    ref = interpret(m, args)
    out = simulate(run_pipeline(m, v2_pipeline(8)), args)
    for a, r in zip(out, ref):   # both sides end rounded to the dtype: a flipped rounding of a
        assert rel_err(a, r) <= TOL[cfg["dtype"]]   # few of 64 outputs is ~1 unit roundoff


def test_rows_of_131072_tokens_in_the_simulator():
    """The issue's longest rows: a full 131072-token cache (the 64-chunk clamp, chunks of 2048
    tokens) and one token short of it, beside a one-token row."""
    m = block("f16", heads=2, kv_heads=1, head_dim=16, hidden=64, max_seq=131072)
    lens = [131072, 131071, 1]
    L, splits = split_plan(lens, 1, 132, 131072)
    assert splits.tolist()[:2] == [64, 64] and int(L[0]) == 2048
    args = inputs(m.graphs[0], 3, lens, np.random.default_rng(11))
    ref = interpret(m, args)
    out = simulate(run_pipeline(m, v2_pipeline(4)), args)
    for a, r in zip(out, ref):
        assert rel_err(a, r) <= TOL["f16"]


def test_gptj_partial_rotary_and_llama31_scaling_in_the_simulator():
    g = tiny(style="gptj", rotary_dim=16, scaling=[8, 1, 4, 64])
    rng = np.random.default_rng(3)
    args = inputs(g.graphs[0], 3, [80, 1, 40], rng)
    ref = interpret(g, args)
    low = run_pipeline(g, v2_pipeline(4))
    assert any(op.name == "attn_units" for k in low.graphs for op in k.body)
    for a, r in zip(simulate(low, args), ref):
        assert rel_err(a, r) <= 2e-3


def test_the_default_pipeline_takes_the_units_where_they_run_and_the_host_elsewhere():
    from fusionc.runtime.pipelines import v2_default_pipeline
    units = [block(), block(qk_norm=True), block("f32"), block(heads=34, kv_heads=2, hidden=64),
             block(head_dim=160, heads=4, kv_heads=2), block("f32", head_dim=96),
             block("f32", heads=34, kv_heads=2, hidden=64), block(head_dim=256, heads=2,
                                                                   kv_heads=1),
             block("f32", head_dim=176, heads=32, kv_heads=2, hidden=64)]
    for m in units:   # the fused kernels, the attention core on the units
        assert "partition-units" in v2_default_pipeline(m.graphs[0], 4)
    assert v2_default_pipeline(block().graphs[0], 256) == \
        "fold-views,fuse-allreduce-norm,attention-units{max_batch=256},lower-library"
    host = [block(head_dim=272, heads=4, kv_heads=2), block(head_dim=512, heads=2, kv_heads=1),
            block("f32", head_dim=208), block("f32", head_dim=192, heads=32, kv_heads=2,
                                              hidden=64)]
    for m in host:   # the mixed path, the attention on the host
        assert "attention-units{max_batch=4,host=true}" in v2_default_pipeline(m.graphs[0], 4)
    mla = example("deepseek_v2_lite")   # the MLA units
    for x in mla.graphs:
        if any(op.name == "mla_decode_attention" for op in x.body):
            assert "partition-units" in v2_default_pipeline(x, 4)


def test_attention_only_graph_without_o_projection_runs_its_attention_on_the_host():
    from tests.gpu.compiled_cases import attention_only
    from fusionc.runtime.pipelines import v2_default_pipeline
    m = attention_only(hidden=128, heads=4, kv_heads=2, head_dim=32, max_seq=64)
    assert "host=true" in v2_default_pipeline(m.graphs[0], 8)


def test_units_refuse_f32_past_head_dim_192_by_name():
    """f32 runs by FMA on four warps up to head_dim 192 (its default is v2 there)."""
    import fusionc as fc
    for d in (208, 256):   # ptxas spills the fp32 accumulators there
        with pytest.raises(CompileError, match=f"f32 at head_dim {d}") as e:
            fc.compile(block("f32", head_dim=d, heads=4, kv_heads=2), max_batch=2,
                       pipeline=v2_pipeline(2))   # the fused path (v2's default: the host)
        assert e.value.op == "attn_units"
    # 16-head blocks at head_dim 192: two stages of the four warps' rings do not fit
    wide = block("f32", head_dim=192, heads=32, kv_heads=2, hidden=64)
    fc.compile(wide, max_batch=4)   # the host's library attention takes it


@pytest.mark.parametrize("dtype,kw", [("f16", dict(head_dim=128, heads=32, kv_heads=8)),
                                      ("bf16", dict(head_dim=80, heads=4, kv_heads=2)),
                                      ("f32", dict(head_dim=128, heads=32, kv_heads=8)),
                                      ("f32", dict(head_dim=64, heads=16, kv_heads=1,
                                                   qk_norm=True)),
                                      ("f16", dict(head_dim=64, heads=32, kv_heads=1)),
                                      ("f32", dict(head_dim=80, heads=40, kv_heads=2)),
                                      ("f16", dict(head_dim=256, heads=4, kv_heads=2,
                                                   qk_norm=True)),
                                      ("bf16", dict(head_dim=160, heads=8, kv_heads=2)),
                                      ("f16", dict(head_dim=224, heads=4, kv_heads=2)),
                                      ("f32", dict(head_dim=112, heads=4, kv_heads=2)),
                                      ("f32", dict(head_dim=192, heads=4, kv_heads=2))])
def test_attention_units_compile_without_spills(dtype, kw):
    from fusionc.codegen.compile import compile_kernel
    low = run_pipeline(block(dtype, **kw), UNFUSED(16))
    k = next(g for g in low.graphs if g.kind == "kernel" and g.body[0].name == "attn_units")
    ck = compile_kernel(k)
    assert ck.spills == 0, ck.report()
    src = ck.source
    assert src.blocks == 132 and src.smem_bytes <= 232448 and src.pdl
    blocks = -(-kw["heads"] // kw["kv_heads"] // 16)   # query blocks per KV head
    assert src.counters == 16 * kw["kv_heads"] * blocks + 1 and src.resident   # + error word
    assert src.persistent_units == 132 and "u += grid" in src.source
    assert "fc_counter_arrive(cnt) == static_cast<unsigned>(splits - 1)" in src.source   # last merges
    assert "fc_counter_wait<" not in src.source   # nothing waits


def test_split_plan_leaves_no_chunk_empty_after_rounding():
    # 130 tiles on 132 CTAs: 130 chunks clamped to 64 of 3 tiles; 44 of them cover the row
    L, splits = split_plan([130 * TILE], 1, 132, 130 * TILE)
    assert (L.tolist(), splits.tolist()) == ([3 * TILE], [44])


def test_split_plan_takes_more_waves_where_whole_rows_leave_the_last_one_empty():
    # 40 MHA heads x 4 rows of 32 tiles on 132 CTAs: 160 whole rows are 2 waves (the second
    # 28/132 full); 640 quarter rows are 5 nearly full waves of 8 tiles
    L, splits = split_plan([4096] * 4, 40, 132, 4096)
    assert L.tolist() == [8 * TILE] * 4 and splits.tolist() == [4] * 4
    L, splits = split_plan([16384] * 16, 32, 132, 16384)   # 512 whole rows: 3.9 full waves
    assert splits.tolist() == [1] * 16


def _swap(text: str) -> str:
    """The attention block's IR with decode_attention reading the appended caches swapped."""
    import re
    return re.sub(r"decode_attention\(%(\S+), %(\S+), %(\S+),", r"decode_attention(%\1, %\3, %\2,",
                  text)


def test_swapped_caches_are_not_taken_as_an_attention_core():
    from fusionc.ir import parse_module
    from fusionc.lower.attention_v2 import attention_cores
    m = parse_module(_swap(print_module(block())))
    g = m.graphs[0]
    assert "decode_attention(%q_rot, %v_cache.1, %k_cache.1" in print_module(m)
    assert attention_cores(g) == []   # v2's default: the attention on the host
    from fusionc.errors import LoweringError
    with pytest.raises(LoweringError, match="outside the block form") as e:
        run_pipeline(m, v2_pipeline(4))
    assert e.value.op == "decode_attention" and e.value.loc is not None


def test_one_tensor_as_both_caches_is_a_named_verify_error():
    from fusionc.errors import VerifyError
    from fusionc.ir import parse_module
    text = print_module(block()).replace("kv_cache_append(%k_cache, %v_cache,",
                                         "kv_cache_append(%k_cache, %k_cache,")
    with pytest.raises(VerifyError, match="both the K and the V cache") as e:
        parse_module(text)
    assert e.value.op == "kv_cache_append"


def test_a_static_batch_above_the_bucket_sizes_the_units_kernel():
    from fusionc.lower.attention_v2 import attention_cores, lower_core
    from fusionc.passes.fold_views import fold_views

    g = tiny(B=24)
    core, = attention_cores(fold_views(g.graphs[0]))
    assert lower_core(core, "k", max_batch=8).attr("max_batch") == 24
    rng = np.random.default_rng(5)
    lens = rng.integers(0, 81, 24).tolist()
    args = inputs(g.graphs[0], 24, lens, rng)
    for a, r in zip(simulate(run_pipeline(g, v2_pipeline(8)), args), interpret(g, args)):
        assert rel_err(a, r) <= 2e-3


def test_a_chunk_takes_the_library_path_and_a_norm_after_the_block_the_mixed_path():
    import fusionc as fc
    from fusionc.models.prefill import chunk_attention_block
    from fusionc.runtime.pipelines import v2_default_pipeline
    sizes = dict(hidden=128, heads=4, kv_heads=2, head_dim=32, max_seq=96)
    chunk = chunk_attention_block(eps=1e-5, theta=1e4, dtype="f16", **sizes)
    assert v2_default_pipeline(chunk.graphs[0], 8).endswith("lower-library")
    assert "attention-units" not in v2_default_pipeline(chunk.graphs[0], 8)
    normed = tiny(lambda y, kc, vc, k_cache, w_n, pos: (fc.rms_norm(y, w_n, 1e-5), kc, vc))
    for rows in (8, 64):
        assert "attention-units{max_batch=%d}" % rows in v2_default_pipeline(normed.graphs[0],
                                                                            rows)


def _roped():
    """The tiny block, then a RoPE of its output's heads outside the block."""
    import fusionc as fc
    return tiny(lambda y, kc, vc, k_cache, w_n, pos: (
        fc.merge_heads(fc.rope(fc.split_heads(y, 2), pos, 1e4)), kc, vc))


@pytest.mark.parametrize("tail", ["norm", "rope"])
@pytest.mark.parametrize("rows", [3, 8, 40])
def test_ops_after_the_block_take_the_mixed_path_at_any_batch(tail, rows):
    """A norm or a RoPE after the attention block (ops no fused kernel absorbs) runs on the
    mixed path at every batch (GEMMs, the units, host row kernels), as v2's default."""
    import fusionc as fc
    from fusionc.runtime.pipelines import v2_default_pipeline
    m = _roped() if tail == "rope" else \
        tiny(lambda y, kc, vc, k_cache, w_n, pos: (fc.rms_norm(y, w_n, 1e-5), kc, vc))
    g = m.graphs[0]
    pipe = v2_default_pipeline(g, rows)
    assert "attention-units" in pipe and pipe.endswith("lower-library")
    rng = np.random.default_rng(rows)
    args = inputs(g, rows, rng.integers(0, 81, rows).tolist(), rng)
    for a, r in zip(simulate(run_pipeline(m, pipe), args), interpret(m, args)):
        assert rel_err(a, r) <= TOL["f16"]


def test_past_the_bucket_the_mixed_path_runs_gemms_around_the_units():
    from fusionc.runtime.pipelines import v2_default_pipeline
    m = block(hidden=64, heads=4, kv_heads=1, head_dim=16, max_seq=40)
    g = m.graphs[0]
    pipe = v2_default_pipeline(g, 200)
    assert pipe == "fold-views,fuse-allreduce-norm,attention-units{max_batch=200},lower-library"
    low = run_pipeline(m, pipe)
    host = low["attention"]
    assert [op.name for op in host.body] == ["rms_norm", "library_call", "launch",
                                             "library_call", "add"]
    assert low[host.body[2].attr("kernel").name].attr("max_batch") == 200
    rng = np.random.default_rng(1)
    lens = rng.integers(0, 41, 140).tolist()
    args = inputs(g, 140, lens, rng)
    for a, r in zip(simulate(low, args), interpret(m, args)):
        assert rel_err(a, r) <= TOL["f16"]


def test_attention_units_pass_alone_shows_in_ir_after():
    low = run_pipeline(block(), "fold-views,attention-units{max_batch=4}")
    text = print_module(low)
    assert "attn_units(" in text and "linear(%h, %w_qkv)" in text and "rope(" not in text


def _with_old_cache_read():
    """The attention block, also returning k_cache + k_cache of the cache *input*."""
    return tiny(lambda y, kc, vc, k_cache, w_n, pos: (y, kc, vc, k_cache + k_cache))


def test_a_cache_read_beside_its_in_place_append_is_refused_by_name():
    from fusionc.errors import LoweringError
    from fusionc.runtime.pipelines import v2_default_pipeline
    m = _with_old_cache_read()
    with pytest.raises(LoweringError, match="outside the block form") as e:
        run_pipeline(m, "fold-views,attention-units{max_batch=200},lower-library")
    assert e.value.op == "decode_attention"
    for rows in (4, 200):   # the host's append is in place too
        with pytest.raises(LoweringError, match="read beside its kv_cache_append") as e:
            run_pipeline(m, v2_default_pipeline(m.graphs[0], rows))
        assert e.value.op == "kv_cache_append" and e.value.loc is not None


def test_mixed_path_choices_follow_what_the_host_can_run():
    from fusionc.errors import LoweringError
    from fusionc.runtime.pipelines import v2_default_pipeline
    from fusionc.tune.search import candidates
    g = block().graphs[0]
    assert [c.path for c in candidates(g, 200)] == ["mixed"]
    assert [c.path for c in candidates(_roped().graphs[0], 200)] == ["mixed"]
    import fusionc as fc
    ints = tiny(lambda y, kc, vc, k_cache, w_n, pos: (y, kc, vc, fc.cast(pos, "f32")))
    with pytest.raises(LoweringError, match="whose cast the host cannot run") as e:
        v2_default_pipeline(ints.graphs[0], 200)   # the host's row kernels take floats
    assert e.value.op == "cast" and e.value.loc is not None


def test_a_bucket_too_big_for_the_unit_prefix_is_named():
    from fusionc.codegen import compile_kernel
    low = run_pipeline(block(), "fold-views,attention-units{max_batch=60000}")
    k = next(g for g in low.graphs if g.kind == "kernel")
    with pytest.raises(CompileError, match="a bucket of 60000 rows"):
        compile_kernel(k)
