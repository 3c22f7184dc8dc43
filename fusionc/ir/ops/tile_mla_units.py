"""Tile IR (design v2): the core of a multi-head latent attention (MLA) block as work units over
every SM, 1 to 128 heads (issue 27).

``mla_units(%q, %q_latent, %kv_a, %cache, %positions, %seq_lens, %o, %kv_norm?)
{grid, scale, theta, style, rotary_dim, scaling, eps, nope, tile}``
    ``q: [B, H·(nope + R)]`` is the query projection's output (per head nope dims, then R RoPE
    dims); ``q_latent: [B, H, L]`` is W_UKᵀ q_nope (``head_linear``); ``kv_a: [B, L + R]``
    the latent projection's output (c, then k_rope); ``cache: [B, S, L + R]``; ``o: [B, H, L]``
    is written. Per batch row b it computes what the graph ops around
    ``mla_decode_attention`` compute (DeepSeek-V2, arXiv 2405.04434, §2.1.2-2.1.3 and
    appendix C; :mod:`fusionc.ir.ops.mla`), each result rounded to the dtype as the graph
    rounds it:

    - the new cache row [rms_norm(c, kv_norm) ; rope(k_rope)] goes to ``cache[b, positions[b]]``
      (positions outside [0, S) are skipped, never a fault);
    - per head h the query [q_latent[b, h] ; rope(q_rope[b, h])] against the first
      n = clamp(seq_lens[b], 0, S) cache rows (the row at positions[b] read as just appended):
      s_t = scale · q · row_t, o = Σ_t softmax(s)_t · row_t[:L]; n = 0 gives 0. The
      probabilities are rounded to the dtype before P·V (tensor-core operands; fp32 rounds
      nothing: FMA) while l sums them in fp32, as in ``attn_units``.

    **Work units**: the heads in blocks of ``block`` (:func:`block_heads`: 16, 32 or 64, one to four
    16-row tiles of the mma, whose fragment layout fp32's FMA keeps; fp32 always 16); unit
    (b, c, j) is chunk c of head block j of row b, numbered in that order, the chunks from
    ``attn_units``' split plan with the head blocks in place of KV heads
    (:func:`fusionc.ir.ops.tile_attn_units.split_plan`, computed on the device from
    ``seq_lens``). The head blocks of one chunk are neighbours, so they read its rows while the
    others keep them in L2. The chunk 0 unit of block 0 does the append. Partials (m, l, o) go
    to global slots and merge in two levels (:func:`merge_tree`): the unit that counts last on
    the counter of its group of ``MERGE_GROUP`` consecutive chunks merges the group's slots in
    chunk order (into the group's first slot, or into ``o`` when the row has one group), then
    the last group merger of (b, j) merges the groups' slots in order. Each merge is one SM
    reading its slots through L2, so two levels bound its bytes by ``MERGE_GROUP`` slots
    rather than every chunk's (up to ``MAX_SPLITS``). Every merger sets its counter back to
    zero.
"""
from __future__ import annotations

import math

import numpy as np

from fusionc.interp.numerics import round_to
from fusionc.ir.ops.norm import rms_norm_values
from fusionc.ir.ops.rope import rope_values
from fusionc.ir.ops.tile_attn_units import (TILE, WAVES, _merge, partial_merge, split_plan,
                                           verify_units)
from fusionc.ir.ops.tile_memory import K
from fusionc.ir.registry import (FLOAT, FLOATS, POS_INT, Cost, OpDef, attr, enum, fail,
                                 register)
from fusionc.ir.types import DType

# The split plan's granularity for MLA (attention units: TILE = 128), by batch bucket. A unit
# streams its chunk in steps of 32 tokens with four barriers each, latency-bound at few rows: at
# batch 1, KV 1K, 128-token chunks made 8 units of 4 steps on 8 of 132 SMs (one SM busy 26 of
# the kernel's 31 us; ncu, H100, 2026-12-07). Batch 1, KV 1K / 4K / 16K, one call: 128-token
# chunks 51.1 / 60.6 / 68.5 us, 64-token chunks with mla_merge_loads 2: 51.1 / 53.0 / 66.8
# (KV 1K: 16 chunks take a second merge level). Above 8 rows 128 stays (not measured worse
# with 64, but not better either). BENCHMARKS.md, eighth session.
MLA_TILE, MLA_TILE_ROWS = 64, 8


def mla_tile(max_batch: int) -> int:
    """The ``tile`` attribute of an ``mla_units`` op of batch bucket ``max_batch``."""
    return MLA_TILE if max_batch <= MLA_TILE_ROWS else TILE


def mla_merge_loads(max_batch: int) -> int:
    """float4 loads of each slot one thread of the template's merge keeps in flight per pass:
    2 up to ``MLA_TILE_ROWS`` rows (one merge at a time, latency-bound: batch 1 KV 1K / 4K
    50.7 / 52.8 us against 53.1 / 54.8 with 1), 1 above (many merges share L2: batch 16 KV 16K
    184.0 us against 189.7 with 2; H100, 2026-12-07). The order of the sums is the same."""
    return 2 if max_batch <= MLA_TILE_ROWS else 1

MAX_HEADS = 128   # DeepSeek-V3; more would only need more head blocks
MERGE_GROUP = 8   # chunks one merger reads at either level (MAX_SPLITS = 64 is 8 groups of 8)


def merge_groups(splits: int) -> int:
    """Groups of ``MERGE_GROUP`` consecutive chunks of a (row, head block) with ``splits``
    chunks: the first merge level's counters."""
    return -(-splits // MERGE_GROUP)


def merge_tree(parts: list) -> np.ndarray:
    """o of a (row, head block) from its chunks' partials (m, l, o) in the kernel's order:
    each group of ``MERGE_GROUP`` merged in chunk order to an unnormalised (m, l, o), then
    the groups in order (:func:`fusionc.ir.ops.tile_attn_units._merge`'s formula, fp32)."""
    if len(parts) <= MERGE_GROUP:
        return _merge(parts)
    return _merge([partial_merge(parts[i:i + MERGE_GROUP])
                   for i in range(0, len(parts), MERGE_GROUP)])


# Query heads of one unit above 32 heads, by batch bucket. Smaller blocks make more, shorter
# units (a latency-bound unit at few rows) but read the latent cache once per block. V3 (128
# heads), H100, 2026-12-07, one call, blocks of 16 / 32 / 64, µs: batch 1 KV 1K 173.8 / 182.3 /
# 205.6, 4K 187.5 / 192.2 / 218.2, 16K 237.6 / 227.4 / 247.7; batch 16 KV 1K 243.0 / 236.2 /
# 267.1, 4K 422.3 / 353.0 / 350.7, 16K 1187.5 / 870.6 / 688.3 (BENCHMARKS.md, eleventh session).
MLA_SMALL_ROWS, MLA_SMALL_BLOCK = 2, 32


def block_heads(heads: int, dtype: DType | None = None, max_batch: int = 16) -> int:
    """Query heads of one unit (the op's ``block``): 16, 32 or 64 (one, two or four 16-row mma
    tiles). Up to 32 heads, the fewest that hold them; above, blocks of 64 (the last one
    padded), or of ``MLA_SMALL_BLOCK`` up to ``MLA_SMALL_ROWS`` rows (the measurement above).
    fp32 (FMA, rows of 4 bytes in shared memory): always 16."""
    if dtype == DType.f32:
        return 16
    if heads <= 32:
        return 16 if heads <= 16 else 32
    return MLA_SMALL_BLOCK if max_batch <= MLA_SMALL_ROWS else 64


def head_blocks(heads: int, block: int) -> int:
    """Head blocks of a row: ⌈heads / block⌉."""
    return -(-heads // block)


def unsupported(dtype: DType, heads: int, latent: int, rope: int) -> list[str]:
    """Why the MLA units cannot take this geometry (empty: they can); the code generator and
    the default lowering both ask this."""
    bad = []
    if dtype not in (DType.f16, DType.bf16, DType.f32):
        bad.append(f"dtype {dtype} (f16 or bf16 on tensor cores, f32 by FMA)")
    if heads > MAX_HEADS:
        bad.append(f"{heads} heads (at most {MAX_HEADS})")
    if latent % 64:
        bad.append(f"latent dim {latent} (not a multiple of 64)")
    if rope % 16 or rope == 0:
        bad.append(f"rope dim {rope} (a multiple of 16)")
    return bad


def slots(max_batch: int, blocks: int, grid: int) -> int:
    """Partial slots a launch may fill, as :func:`fusionc.ir.ops.tile_attn_units.slots`."""
    return grid * WAVES + max_batch * blocks


def _dims(op):
    q, ql, cache = op.operands[0].type, op.operands[1].type, op.operands[3].type
    heads, lat = ql.shape[1], ql.shape[2]
    return heads, lat, cache.shape[2] - lat, cache.shape[1]


def _infer(op):
    q, ql, kva, cache, pos, lens, o = (v.type for v in op.operands[:7])
    if ql.rank != 3 or not all(isinstance(x, int) for x in ql.shape[1:]) or cache.rank != 3 \
            or not all(isinstance(x, int) for x in cache.shape[1:]):
        fail(op, f"q_latent {ql} and cache {cache}",
             "q_latent [B, H, L] and cache [B, S, L + R], H, L, S, R static")
    b, heads, lat = ql.shape
    rope = cache.shape[2] - lat
    if rope <= 0 or cache.shape[0] != b:
        fail(op, f"cache {cache} with q_latent {ql}", f"cache [{b}, S, {lat} + R], R > 0")
    nope = op.attr("nope")
    want = {"q": (q, (b, heads * (nope + rope))), "kv_a": (kva, (b, lat + rope)),
            "o": (o, (b, heads, lat))}
    for name, (t, shape) in want.items():
        if t.shape != shape:
            fail(op, f"{name} has type {t}", f"[{', '.join(map(str, shape))}]")
    if len({q.dtype, ql.dtype, kva.dtype, cache.dtype, o.dtype}) != 1:
        fail(op, "operands of different dtypes", "one float dtype")
    for t, what in ((pos, "positions"), (lens, "seq_lens")):
        if t.dtype != DType.i32 or t.shape != (b,):
            fail(op, f"{what} has type {t}", f"i32[{b}]")
    if len(op.operands) == 8 and op.operands[7].type.shape != (lat,):
        fail(op, f"kv_norm has type {op.operands[7].type}", f"[{lat}]")
    blk = op.attr("block")
    if blk not in ((16,) if ql.dtype == DType.f32 else (16, 32, 64)):
        fail(op, f"block = {blk}", "16, 32 or 64 query heads a unit (16 for f32)")
    r = op.attr("rotary_dim")
    if r % 2 or r > rope:
        fail(op, f"rotary_dim = {r}", f"an even rotary_dim <= the rope dim {rope}")
    if not 0 < op.attr("scale") < math.inf or not 0 < op.attr("theta") < math.inf:
        fail(op, f"scale = {op.attr('scale')}, theta = {op.attr('theta')}", "finite, > 0")
    return ()


def row_vectors(op, q_row, ql_row, kva_row, pos: int, kv_norm) -> tuple:
    """(queries [H, L + R], the new cache row [L + R]) of one batch row, in fp32, each part
    rounded to the dtype as the graph rounds it."""
    heads, lat, rope, _ = _dims(op)
    dt, nope = op.operands[0].type.dtype, op.attr("nope")
    q = np.asarray(q_row, np.float32).reshape(heads, nope + rope)[:, nope:]
    c, kr = np.asarray(kva_row, np.float32)[:lat], np.asarray(kva_row, np.float32)[lat:]
    if kv_norm is not None:
        c = _round(rms_norm_values(c, np.asarray(kv_norm), op.attr("eps"), np.float32), dt)
    rot = lambda x: _round(rope_values(x[None], np.array([pos]), op, np.float32)[0], dt)
    queries = np.concatenate([np.asarray(ql_row, np.float32), rot(q)], axis=1)
    return queries, np.concatenate([c, rot(kr[None])[0]])


def _round(x, dt):
    return round_to(x, dt).astype(np.float32)


def _simulate(op, args, cta):
    """This CTA's units ``gid``, ``gid + grid``, ...; the partials of each (b, head block)
    merged once all arrived, as the kernel merges them (:func:`merge_tree`)."""
    mem = cta.memory
    read = lambda v: mem.read(v.name, (Ellipsis,), cta, op)
    q, ql, kva, pos, lens = (read(op.operands[i]) for i in (0, 1, 2, 4, 5))
    kv_norm = read(op.operands[7]) if len(op.operands) == 8 else None
    heads, lat, rope, S = _dims(op)
    hb, grid = op.attr("block"), op.attr("grid")
    nb = head_blocks(heads, hb)
    L, splits = split_plan(lens, nb, grid, S, op.attr("tile"))
    first = np.concatenate([[0], np.cumsum(splits * nb)])
    store = mem.__dict__.setdefault("attn_slots", {})
    cache, o = op.operands[3], op.operands[6]
    for u in range(cta.gid, int(first[-1]), grid):
        b = int(np.searchsorted(first, u, side="right")) - 1
        c, j = divmod(u - int(first[b]), nb)
        p = int(pos[b])
        queries, new = row_vectors(op, q[b], ql[b], kva[b], p, kv_norm)
        if c == 0 and j == 0 and 0 <= p < S:
            mem.write(cache.name, (b, p), new, cta, op, cache.type.dtype)
        n = min(max(int(lens[b]), 0), S)
        lo, hi = min(n, c * int(L[b])), min(n, (c + 1) * int(L[b]))
        heads_j = queries[j * hb:(j + 1) * hb]
        got = store.setdefault((id(op), b, j), {})
        got[c] = _partial(op, cta, cache.name, b, lo, hi, p, heads_j, new, lat)
        if len(got) == splits[b]:
            out = merge_tree([got[i] for i in range(int(splits[b]))])
            del store[(id(op), b, j)]
            mem.write(o.name, (b, slice(j * hb, j * hb + len(heads_j))), out, cta, op,
                      o.type.dtype)
    return ()


def _partial(op, cta, cache, b, lo, hi, p, q, new, lat):
    g = q.shape[0]
    if hi <= lo:
        return (np.full(g, -np.inf, np.float32), np.zeros(g, np.float32),
                np.zeros((g, lat), np.float32))
    rows = np.empty((hi - lo, len(new)), np.float32)
    for a, z in ((lo, p), (p + 1, hi)) if lo <= p < hi else ((lo, hi),):
        if z > a:
            rows[a - lo:z - lo] = cta.memory.read(cache, (b, slice(a, z)), cta, op)
    if lo <= p < hi:
        rows[p - lo] = new
    s = (q @ rows.T) * np.float32(op.attr("scale"))
    m = s.max(axis=1)
    e = np.exp(s - m[:, None])
    pv = round_to(e, op.operands[0].type.dtype).astype(np.float32)   # P as the mma's operand
    return m, e.sum(axis=1), pv @ rows[:, :lat]


def _cost(op, env):
    heads, lat, rope, S = _dims(op)
    q, cache = op.operands[0].type, op.operands[3].type
    b = q.concrete(env)[0]
    s = env.get("S", S)
    g = op.attr("grid")   # per CTA, as kernel_cost counts every op (it scales by the grid)
    kv = b * s * (lat + rope) * cache.dtype.itemsize
    return Cost(bytes_read=(2 * q.nbytes(env) + kv) / g,
                bytes_written=b * heads * lat * cache.dtype.itemsize / g,
                flops=2 * b * heads * s * (2 * lat + rope) / g)


register(OpDef(
    "mla_units", __doc__,
    ("q", "q_latent", "kv_a", "cache", "positions", "seq_lens", "o", "kv_norm?"),
    (attr("grid", POS_INT, doc="CTAs of the launch: the work units' stride"),
     attr("scale", FLOAT), attr("theta", FLOAT),
     attr("style", enum("neox", "gptj"), "gptj"), attr("rotary_dim", POS_INT),
     attr("scaling", FLOATS, ()), attr("eps", FLOAT, 1e-6, doc="the latent RMSNorm's epsilon"),
     attr("nope", POS_INT, doc="query dims per head before its RoPE dims"),
     attr("block", POS_INT, 64, doc="query heads of one unit: 16, 32 or 64 (block_heads)"),
     attr("tile", POS_INT, TILE, doc="the split plan's token granularity: chunk lengths are "
          "multiples of it (mla_tile)")),
    _infer, where=K, simulate=_simulate, verify=verify_units, cost=_cost))
