"""Edges of the attention units (issue 22) on the GPU: tokens that dominate the softmax at chunk
edges and at the appended position (a token skipped or read twice by the split shows at once),
16 query heads per KV head, out-of-range positions and lengths (no fault; the other rows
unaffected), an empty batch, a launch on fewer CTAs than compiled for, and the mixed path past
the fused linears' bucket (GEMMs around the units, 256 rows). Against the float64 interpreter
and the simulator, outputs poisoned."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import numpy as np
import pytest

import fusionc as fc
from fusionc.interp import interpret
from fusionc.ir.ops.tile_attn_units import split_plan
from fusionc.lower.attention_v2 import grid
from fusionc.models.blocks import attention_block
from fusionc.sim import simulate
from tests.gpu.common import record
from tests.gpu.test_attention_v2_gpu import _call
from tests.passes.graphs import inputs as random_inputs, rel_err

pytestmark = pytest.mark.gpu

G16 = dict(hidden=256, heads=16, kv_heads=1, head_dim=128, max_seq=40000)
EDGE = dict(hidden=256, heads=8, kv_heads=2, head_dim=64, max_seq=1024)
MIXED = dict(hidden=256, heads=8, kv_heads=2, head_dim=64, max_seq=512)


def _fn(sizes, max_batch, dtype="bf16"):
    m = attention_block(eps=1e-5, theta=1e4, dtype=dtype, **sizes)
    return m, fc.compile(m, max_batch=max_batch, lowering="v2")


def precompile():
    _fn(G16, 2)
    _fn(EDGE, 4, "f16")
    _fn(MIXED, 256, "f16")


def _units(fn):
    return next(lk for lk in fn._loaded.values()
                if lk.compiled.source.kernel.body[0].name == "attn_units")


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
