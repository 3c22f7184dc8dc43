"""The MLA block on lowering v2 (issue 27): what ``partition-units`` makes of it (v2 linears, the
absorbed W_UK and W_UV as block-diagonal kernels or host GEMMs, one ``mla_units`` kernel), ``simulate(lower(g)) ≈
interpret(g)`` over random head counts, latent and rope sizes, lengths and batches
(hypothesis), the mixed path past the bucket, the default lowering's choice, named errors and
NVRTC builds of the MLA-units kernel at 16 and 128 heads."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fusionc as fc
from fusionc.errors import LoweringError
from fusionc.interp import interpret
from fusionc.ir import print_module
from fusionc.ir.ops.tile_mla_units import block_heads, head_blocks
from fusionc.passes import run_pipeline
from fusionc.passes.stream import v2_pipeline
from fusionc.runtime.pipelines import mixed_pipeline, v2_default_pipeline
from fusionc.sim import simulate
from tests.passes.graphs import inputs, rel_err

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
deepseek = importlib.import_module("deepseek_v2_lite")
TOL = {"f16": 2e-3, "bf16": 8e-3, "f32": 1e-4}


def block(dtype="bf16", **kw):
    sizes = dict(hidden=64, heads=3, qk_nope=16, qk_rope=16, v_head=16, kv_lora=64,
                 max_seq=160)
    sizes.update(kw)
    return deepseek.build(dtype=dtype, **sizes)


def test_partition_units_makes_linears_kernels_and_one_mla_units_kernel():
    """Here W_UK (K = nope 16: a tail tile) and W_UV (16 rows per head) stay host GEMMs;
    tests/passes/test_mla_heads.py has them as block-diagonal kernels."""
    low = run_pipeline(block(), "fold-views,partition-units{max_batch=4}")
    host = low["attention"]
    assert [op.name for op in host.body] == ["launch", "reshape", "split", "head_linear",
                                             "launch", "head_linear", "reshape", "launch"]
    core = host.body[4]
    assert [v.name for v in core.operands] == ["q", "q_latent", "kv_a", "cache", "positions",
                                               "seq_lens", "kv_norm"]
    assert [v.name for v in core.results] == ["o_latent", "cache.1"]
    k = low[core.attr("kernel").name]
    op, = k.body
    assert op.name == "mla_units" and op.attr("nope") == 16 and op.attr("style") == "gptj"
    assert [v.name for v in k.outputs] == ["o_latent", "cache"]
    text = print_module(low)
    for gone in ("rope(", "latent_cache_append(", "mla_decode_attention(", "rms_norm("):
        assert gone not in text


@pytest.mark.parametrize("heads,rows,block,blocks", [
    (1, 1, 16, 1), (16, 16, 16, 1), (17, 1, 32, 1), (32, 16, 32, 1), (40, 16, 64, 1),
    (128, 16, 64, 2), (100, 16, 64, 2), (128, 1, 32, 4), (128, 2, 32, 4), (64, 4, 64, 1)])
def test_heads_come_in_blocks_of_16_32_or_64(heads, rows, block, blocks):
    """64 above 32 heads, 32 up to MLA_SMALL_ROWS rows (more units where units are few)."""
    from fusionc.ir.types import DType
    got = block_heads(heads, DType.bf16, rows)
    assert (got, head_blocks(heads, got)) == (block, blocks)
    assert block_heads(heads, DType.f32, rows) == 16


@pytest.mark.parametrize("rows,block", [(1, 32), (16, 64)])
def test_the_lowering_sets_the_block_by_the_bucket(rows, block):
    m = deepseek.build(hidden=512, heads=128, dtype="bf16")
    low = run_pipeline(m, v2_pipeline(rows))
    op = next(g for g in low.graphs if g.kind == "kernel" and g.body[0].name == "mla_units").body[0]
    assert op.attr("block") == block


CONFIGS = st.fixed_dictionaries({
    "heads": st.sampled_from([1, 3, 16, 17, 40, 64, 100, 128]),
    "latent_rope": st.sampled_from([(64, 16), (128, 32), (64, 48)]),
    "dtype": st.sampled_from(["f16", "bf16", "f32"]),
    "lens": st.lists(st.integers(0, 300), min_size=1, max_size=4),
})


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIGS, st.integers(0, 2**31 - 1))
def test_simulate_lowered_mla_matches_interpret(cfg, seed):
    lat, rope = cfg["latent_rope"]
    m = block(cfg["dtype"], heads=cfg["heads"], kv_lora=lat, qk_rope=rope, max_seq=300)
    lens = cfg["lens"]
    args = inputs(m.graphs[0], len(lens), lens, np.random.default_rng(seed))
    ref = interpret(m, args)
    out = simulate(run_pipeline(m, v2_pipeline(8)), args)
    for a, r in zip(out, ref):
        assert rel_err(a, r) <= TOL[cfg["dtype"]]


def test_rows_split_over_many_units_merge_in_chunk_order():
    """A 4096-token row on a few CTAs: many chunks per (row, head block), merged by the last."""
    m = block("f16", heads=40, max_seq=4096)
    lens = [4096, 1, 0, 2500]
    args = inputs(m.graphs[0], 4, lens, np.random.default_rng(3))
    low = run_pipeline(m, "fold-views,partition-units{max_batch=4,grid=6}")
    for a, r in zip(simulate(low, args), interpret(m, args)):
        assert rel_err(a, r) <= TOL["f16"]


def test_neox_rope_and_no_latent_norm_in_the_simulator():
    T = fc.bf16

    @fc.graph
    def g(q: T["B", 2 * 48], q_latent: T["B", 2, 64], kv_a: T["B", 80],
          cache: T["B", 100, 80], positions: fc.i32["B"], seq_lens: fc.i32["B"]):
        q_nope, q_pe = fc.split(fc.split_heads(q, 2), [32, 16])
        q_rot = fc.rope(q_pe, positions, 500.0, style="neox", rotary_dim=8)
        c, k_pe = fc.split(kv_a, [64, 16])
        k_rot = fc.merge_heads(fc.rope(fc.split_heads(k_pe, 1), positions, 500.0,
                                       style="neox", rotary_dim=8))
        cache = fc.latent_cache_append(cache, c, k_rot, positions)
        o = fc.mla_decode_attention(q_latent, q_rot, cache, seq_lens, 0.3)
        return o, cache, q_nope
    m = fc.module(g)
    lens = [77, 3]
    args = inputs(m.graphs[0], 2, lens, np.random.default_rng(9))
    low = run_pipeline(m, "fold-views,attention-units{max_batch=2}")
    op = next(o for k in low.graphs if k.kind == "kernel" for o in k.body)
    assert op.name == "mla_units" and len(op.operands) == 7 and op.attr("rotary_dim") == 8
    for a, r in zip(simulate(low, args), interpret(m, args)):
        assert rel_err(a, r) <= TOL["bf16"]


def test_past_the_bucket_the_mixed_path_runs_gemms_around_the_units():
    m = block()
    g = m.graphs[0]
    assert v2_default_pipeline(g, 200) == mixed_pipeline(200)
    low = run_pipeline(m, mixed_pipeline(200))
    names = [op.name for op in low["attention"].body]
    assert names.count("library_call") == 3 and names.count("head_linear") == 2
    assert names.count("launch") == 1
    lens = [5, 150, 0]
    args = inputs(g, 3, lens, np.random.default_rng(4))
    for a, r in zip(simulate(low, args), interpret(m, args)):
        assert rel_err(a, r) <= TOL["bf16"]


def test_mla_takes_the_fused_kernels_by_default():
    """The MLA units with v2 linears around them at 8 rows (wide tiles where measured
    faster)."""
    g = block().graphs[0]
    pipe = v2_default_pipeline(g, 8)
    assert "partition-units" in pipe and "lower-library" not in pipe


@pytest.mark.parametrize("options", [dict(lowering="v1"), dict(lowering="v1", max_batch=64)])
def test_lowering_v1_is_a_named_error(options):
    """Lowering v1 (cluster kernels, none for MLA) was removed: asking for it is an InputError
    naming what is valid."""
    from fusionc.errors import InputError
    with pytest.raises(InputError) as e:
        fc.compile(block(), **{"max_batch": 2, **options})
    assert "lowering = 'v1'" in e.value.message and "'v2'" in e.value.valid


def test_v2_refuses_odd_latent_sizes_and_other_dtypes_by_name():
    from fusionc.ir.ops.tile_mla_units import unsupported
    from fusionc.ir.types import DType
    assert unsupported(DType.f32, 128, 512, 64) == []   # fp32 by FMA
    assert "dtype f64" in unsupported(DType.f64, 16, 512, 64)[0]
    with pytest.raises(LoweringError) as e:
        run_pipeline(block(kv_lora=96), v2_pipeline(4))
    assert "latent dim 96" in str(e.value)


def test_random_inputs_fill_latent_caches_to_different_lengths():
    from fusionc.commands.compile import random_inputs
    g = block(hidden=64, heads=2, qk_nope=16, qk_rope=16, v_head=16, kv_lora=32,
              max_seq=8)["attention"]
    a = random_inputs(g, 4, np.random.default_rng(1))
    lens = a["seq_lens"]
    assert lens[0] == 8 and len(set(lens.tolist())) > 1
    assert np.array_equal(a["positions"], lens - 1)
    for b, n in enumerate(lens):
        assert np.isnan(a["cache"][b, n:]).all() and not np.isnan(a["cache"][b, :n]).any()


def test_an_unmatched_mla_attention_is_named():
    T = fc.bf16

    @fc.graph
    def g(q_latent: T["B", 2, 64], q_rot: T["B", 2, 16], cache: T["B", 40, 80],
          seq_lens: fc.i32["B"]):
        return fc.mla_decode_attention(q_latent, q_rot, cache, seq_lens, 0.3)
    with pytest.raises(LoweringError) as e:
        run_pipeline(fc.module(g), v2_pipeline(4))
    assert e.value.op == "mla_decode_attention" and "block form" in str(e.value)


@pytest.mark.parametrize("heads,hidden,dtype,regs", [(16, 2048, "bf16", 255),
                                                     (128, 7168, "bf16", 255),
                                                     (3, 256, "f16", 255),
                                                     (16, 2048, "f32", 255),
                                                     (128, 7168, "f32", 255)])
@pytest.mark.parametrize("mb", [1, 16])   # 64-token chunks and two merge loads; 128 and one
def test_mla_units_compile_without_spills(heads, hidden, dtype, regs, mb):
    from fusionc.codegen.compile import compile_kernel
    m = deepseek.build(hidden=hidden, heads=heads, dtype=dtype)
    low = run_pipeline(m, v2_pipeline(mb))
    k = next(g for g in low.graphs if g.kind == "kernel" and g.body[0].name == "mla_units")
    ck = compile_kernel(k)
    assert ck.spills == 0, ck.report()
    assert f"FC_MQ = {1 if mb > 8 else 2}," in ck.source.source
    src = ck.source
    assert src.blocks == 132 and src.smem_bytes <= 232448 and src.pdl and src.resident
    from fusionc.ir.types import DType
    from fusionc.ir.ops.tile_mla_units import MERGE_GROUP
    blk = k.body[0].attr("block")
    assert blk == block_heads(heads, DType(dtype), mb)
    assert src.counters == mb * head_blocks(heads, blk) * (1 + 64 // MERGE_GROUP) + 1
    assert "fc_counter_arrive(top) == static_cast<unsigned>(ng - 1)" in src.source   # 2 levels
    assert "ng == 1 ? out : nullptr,\n             ng == 1 ? nullptr : gslot" in src.source
    assert "fc_counter_wait<" not in src.source   # nothing waits


def test_many_chunks_merge_in_two_levels():
    """A 2500-token row on 132 CTAs at 2 rows (64-token chunks, mla_tile): 40 chunks, merged as
    5 groups of <= MERGE_GROUP, then the groups; the tree gives the one-level merge's result to
    fp32 rounding."""
    from fusionc.ir.ops.tile_attn_units import _merge, split_plan
    from fusionc.ir.ops.tile_mla_units import MERGE_GROUP, merge_groups, merge_tree, mla_tile
    _, splits = split_plan(np.array([2500]), 1, 132, 4096, mla_tile(2))
    assert splits[0] > MERGE_GROUP and merge_groups(int(splits[0])) == 5
    rng = np.random.default_rng(7)
    parts = [(rng.standard_normal(4).astype(np.float32) * 3, rng.random(4).astype(np.float32),
              rng.standard_normal((4, 8)).astype(np.float32)) for _ in range(20)]
    parts[3] = (np.full(4, -np.inf, np.float32), np.zeros(4, np.float32),
                np.zeros((4, 8), np.float32))   # an empty chunk
    assert np.allclose(merge_tree(parts), _merge(parts), rtol=1e-5, atol=1e-6)
    m = block("bf16", heads=16, max_seq=4096)
    args = inputs(m.graphs[0], 2, [2500, 7], np.random.default_rng(8))
    for a, r in zip(simulate(run_pipeline(m, v2_pipeline(2)), args), interpret(m, args)):
        assert rel_err(a, r) <= TOL["bf16"]


def test_mla_units_take_64_token_chunks_up_to_8_rows_and_128_above():
    """The split plan's granularity follows the batch bucket (tile_mla_units.mla_tile: 64-token
    chunks measured faster at one row; 128 kept above 8 rows), and so do the merge's loads in
    flight (mla_merge_loads: FC_MQ 2 at few rows, 1 above)."""
    from fusionc.ir.ops.tile_mla_units import mla_tile
    from fusionc.passes import parse_pipeline
    assert (mla_tile(1), mla_tile(8), mla_tile(16)) == (64, 64, 128)
    for mb, tile in ((1, 64), (16, 128)):
        out = run_pipeline(block(), parse_pipeline(v2_pipeline(mb)))
        units = [op for g in out.graphs if g.kind == "kernel" for op in g.body
                 if op.name == "mla_units"]
        assert units and all(op.attr("tile") == tile for op in units)
