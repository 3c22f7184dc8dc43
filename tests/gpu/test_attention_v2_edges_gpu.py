"""Edges of the attention units (issue 22) on the GPU: tokens that dominate the softmax at chunk
edges and at the appended position (a token skipped or read twice by the split shows at once),
16 query heads per KV head, out-of-range positions and lengths (no fault; the other rows
unaffected), an empty batch, a launch on fewer CTAs than compiled for, the mixed path past
the fused linears' bucket (GEMMs around the units, 256 rows), and rows of 131072 tokens whose
cache elements lie past 2^31 (64-bit offsets). Against the float64 interpreter and the
simulator, outputs poisoned."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import numpy as np
import pytest

import fusionc as fc
from fusionc.interp import interpret
from fusionc.ir.ops.tile_attn_units import split_plan
from fusionc.lower.attention_v2 import grid
from fusionc.models.blocks import attention_block
from fusionc.runtime.transfer import upload
from fusionc.sim import simulate
from tests.gpu.common import record
from tests.gpu.test_attention_v2_gpu import _call
from tests.passes.graphs import inputs as random_inputs, rel_err

pytestmark = pytest.mark.gpu

G16 = dict(hidden=256, heads=16, kv_heads=1, head_dim=128, max_seq=40000)
EDGE = dict(hidden=256, heads=8, kv_heads=2, head_dim=64, max_seq=1024)
MIXED = dict(hidden=256, heads=8, kv_heads=2, head_dim=64, max_seq=512)
LONG = dict(hidden=256, heads=32, kv_heads=8, head_dim=128, max_seq=131072)   # 4.6 GB a cache


def _fn(sizes, max_batch, dtype="bf16"):
    m = attention_block(eps=1e-5, theta=1e4, dtype=dtype, **sizes)
    return m, fc.compile(m, max_batch=max_batch, lowering="v2")


def precompile():
    _fn(G16, 2)
    _fn(EDGE, 4, "f16")
    _fn(MIXED, 256, "f16")
    _fn(LONG, 17, "f16")


def _units(fn):
    return next(lk for lk in fn._loaded.values()
                if any(op.name == "attn_units" for op in lk.compiled.source.kernel.body))


def test_dominant_tokens_at_chunk_edges_and_the_new_token_g16():
    m, fn = _fn(G16, 2)
    g = m.graphs[0]
    lens = [37000, 1]
    rng = np.random.default_rng()
    args = random_inputs(g, 2, lens, rng)
    L, splits = split_plan(lens, 1, grid(), G16["max_seq"])
    edges = sorted({j for c in range(1, int(splits[0])) for j in (c * int(L[0]) - 1,
                                                                  c * int(L[0]))})
    for j in edges[::3]:   # a third of the edges: several still dominate each merge
        args["k_cache"][0, j] *= 6.0
        args["v_cache"][0, j] *= 40.0
    got = _call(fn, g, args)
    ref = interpret(m, args, precise=True)
    sim = simulate(fn.module, args)
    e_ref = max(rel_err(a, r) for a, r in zip(got, ref))
    e_sim = max(rel_err(a, s) for a, s in zip(got, sim))
    record("attention v2 edges", "g16 dominant", f"{int(splits[0])} chunks of {int(L[0])}, "
           f"vs f64 {e_ref:.1e}, vs sim {e_sim:.1e}")
    assert int(splits[0]) > 8 and e_ref <= 1e-2 and e_sim <= 8e-3
    assert _units(fn).errors() == 0


def test_out_of_range_rows_leave_the_others_alone_and_an_empty_batch_runs():
    m, fn = _fn(EDGE, 4, "f16")
    g = m.graphs[0]
    S = EDGE["max_seq"]
    rng = np.random.default_rng()
    args = random_inputs(g, 4, [700, S, 129, 0], rng)
    good = {k: v.copy() for k, v in args.items()}
    args["positions"][1], args["seq_lens"][1] = -5, S + 100   # no append, S tokens read
    args["positions"][3], args["seq_lens"][3] = S, -3         # no append, no token read
    got = _call(fn, g, args)
    sim = simulate(fn.module, args)
    good["positions"][1], good["positions"][3] = 0, 0
    ref = interpret(m, good, precise=True)
    rows = [0, 2]
    e_ref = rel_err(got[0][rows], ref[0][rows])
    e_sim = max(rel_err(a, s) for a, s in zip(got, sim))
    assert np.isfinite(got[0]).all() and e_ref <= 1e-2 and e_sim <= 2e-3
    np.testing.assert_array_equal(got[1][1], args["k_cache"][1].astype(np.float16))
    assert _units(fn).errors() == 0
    empty = random_inputs(g, 0, [], rng)
    out = _call(fn, g, empty)
    assert out[0].shape == (0, EDGE["hidden"])
    record("attention v2 edges", "out of range", f"good rows vs f64 {e_ref:.1e}, "
           f"vs sim {e_sim:.1e}; batch 0 ok")


def test_fewer_ctas_than_compiled_for_give_the_same_result():
    m, fn = _fn(EDGE, 4, "f16")
    g = m.graphs[0]
    rng = np.random.default_rng()
    args = random_inputs(g, 3, [1024, 500, 3], rng)
    full = _call(fn, g, args)
    lk = _units(fn)
    lk.grid = 7
    small = _call(fn, g, args)
    lk.grid = grid()
    ref = interpret(m, args, precise=True)
    e = max(rel_err(a, r) for a, r in zip(small, ref))
    record("attention v2 edges", "7 CTAs", f"vs f64 {e:.1e}")
    assert e <= 1e-2 and lk.errors() == 0
    assert rel_err(small[0], full[0]) <= 2e-3


def test_mixed_path_at_256_rows():
    m, fn = _fn(MIXED, 256, "f16")
    g = m.graphs[0]
    rng = np.random.default_rng()
    lens = [0, 1] + [int(n) for n in rng.integers(0, MIXED["max_seq"] + 1, 254)]
    args = random_inputs(g, 256, lens, rng)
    got = _call(fn, g, args)
    ref = interpret(m, args, precise=True)
    e = max(rel_err(a, r) for a, r in zip(got, ref))
    names = [op.name for op in fn.module["attention"].body]
    record("attention v2 edges", "mixed 256 rows", f"{names}, vs f64 {e:.1e}")
    assert "library_call" in names and "launch" in names and e <= 1e-2
    assert int(_units(fn).counters.sum()) == 0


def test_rows_of_131072_tokens_past_32_bit_offsets():
    """17 rows of a 131072-token cache of 8 KV heads x 128: row 16 starts at element
    16 * 131072 * 1024 = 2^31 (64-bit offsets in the copies and the append). Rows of 131072
    (the cache full) and 131071 tokens and a short row, each against the float64 interpreter
    on its own (the caches in float64 would take 37 GB); the others must be finite. The caches
    are filled on the GPU, NaN past each length."""
    import cupy
    m, fn = _fn(LONG, 17, "f16")
    g = m.graphs[0]
    B, S = 17, LONG["max_seq"]
    rng = np.random.default_rng()
    lens = [int(n) for n in rng.integers(1, 65, B)]
    lens[-2:] = [S - 1, S]
    small = attention_block(eps=1e-5, theta=1e4, dtype="f16", **dict(LONG, max_seq=16))
    args = {k: v for k, v in random_inputs(small.graphs[0], B, [1] * B, rng).items()
            if "cache" not in k}
    args["seq_lens"] = np.array(lens, np.int32)
    args["positions"] = np.array(lens, np.int32) - 1
    dev = {p.name: upload(args[p.name], p.type.dtype) for p in g.params if p.name in args}
    caches = []
    for _ in range(2):
        c = cupy.empty((B, S, LONG["kv_heads"], LONG["head_dim"]), cupy.float16)
        for b in range(B):
            c[b] = cupy.random.standard_normal(c.shape[1:], dtype=cupy.float32)
            c[b, lens[b]:] = cupy.nan   # never read (the append fills position lens - 1)
        caches.append(c)
    dev["k_cache"], dev["v_cache"] = caches
    rows = [0, B - 2, B - 1]
    before = {b: [c[b].get() for c in caches] for b in rows}
    y = cupy.empty((B, LONG["hidden"]), cupy.float16)
    y.fill(np.float16(np.nan))   # poisoned: every element must be written
    outs = fn(**dev, outputs={g.outputs[0].name: y})
    cupy.cuda.get_current_stream().synchronize()
    got = cupy.asnumpy(outs[0]).astype(np.float64)
    assert np.isfinite(got).all() and _units(fn).errors() == 0
    errs = []
    for b in rows:
        one = {k: (v[b:b + 1] if k in ("x", "positions", "seq_lens") else v)
               for k, v in args.items()}
        one["k_cache"], one["v_cache"] = (x[None].astype(np.float64) for x in before[b])
        ref = interpret(m, one, precise=True)
        errs.append(rel_err(got[b:b + 1], ref[0]))
        p = lens[b] - 1   # the appended k at its (64-bit) offset
        k_new = cupy.asnumpy(outs[1][b, p]).astype(np.float64)
        assert rel_err(k_new, ref[1][0, p]) <= 1e-2
    record("attention v2 edges", "131072 tokens",
           "rows 0, 15, 16 vs f64 " + ", ".join(f"{e:.1e}" for e in errs))
    assert max(errs) <= 1e-2
