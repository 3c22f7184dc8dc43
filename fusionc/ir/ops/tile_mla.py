"""Tile IR: split-KV decode attention over the latent cache of multi-head latent attention.

The weight-absorbed MLA score and output (DeepSeek-AI 2024, "DeepSeek-V2", arXiv 2405.04434,
§2.1.2-2.1.3 and appendix C): the cache holds one row ``[c_KV ; k_R]`` of width W = latent +
rope per token, shared by all heads; q = ``[W_UKᵀ q_nope ; q_rope]`` is ``[B, G, W]``. With
s_t = scale · q[b, g] · cache[b, t] in fp32 (the full row: latent and RoPE parts),
m = max_t s_t, l = Σ_t exp(s_t − m), o = Σ_t exp(s_t − m) · cache[b, t, :latent] (the value is
the latent part of the same row: K and V are one stream). The token at positions[b] takes
``new`` ([B, W], appended in this launch). Chunks of tokens as ``attn_partial``
(n = clamp(seq_lens[b], 0, max_seq), tile-aligned). The tensor-core code (16-bit caches)
rounds the probabilities to the cache dtype before P·V, as FlashAttention does, while l sums
them in fp32; the spec and the CUDA-core code keep P in fp32 (differences ~1e-3 relative).

``mla_attn_unit(%q, %cache, %seq_lens, %positions, %new) {unit, units, tile, scale, latent}
-> (m: f32[1, G], l: f32[1, G], o: f32[1, G, latent])``
    (m, l, o) over one *work unit* of a grid-wide split: with the run-time batch B, each row is
    split into per = max(1, units // B) parts; unit u = ``unit`` (one per CTA) takes row
    b = u // per, part u % per (units past per·B are idle: (−inf, 0, 0)). q is a global
    parameter ``[B, G, W]`` (written before a ``grid_barrier``), so a CTA reads only its row.
    Needs B <= units.
``attn_merge(%m, %l, %o, %seq_lens) -> f32[B, G, D]``
    Merges the partials of ``mla_attn_unit`` (m, l: ``[units, G]``, o: ``[units, G, D]``): row b
    takes units [b·per, (b+1)·per) with per = max(1, units // B),
    o_b = Σ_u e_u o_u / Σ_u e_u l_u, e_u = exp(m_u − max_u m_u) (0 for m_u = −inf); a row with
    Σ e_u l_u = 0 (no tokens) gives exactly 0.
"""
from __future__ import annotations

import numpy as np

from fusionc.errors import SimulationError
from fusionc.ir.ops.tile_attention import chunk_range
from fusionc.ir.ops.tile_memory import K, param_of
from fusionc.ir.registry import AFFINE, FLOAT, POS_INT, Cost, OpDef, attr, fail, register
from fusionc.ir.types import DType


def _rows(cta, op, name, b, lo, hi, pos, new):
    """Cache rows lo..hi of batch row b in fp32; the appended token's row from ``new`` (the
    token appended in this launch; its cache row is not read)."""
    out = np.empty((hi - lo, new.shape[0]), np.float32)
    inside = lo <= pos < hi
    for a, z in ((lo, pos), (pos + 1, hi)) if inside else ((lo, hi),):
        if z > a:
            out[a - lo:z - lo] = cta.memory.read(name, (b, slice(a, z), slice(None)), cta, op)
    if inside:
        out[pos - lo] = new
    return out


F32_MAX = float(np.finfo(np.float32).max)


def unit_row(u: int, units: int, batch: int) -> tuple[int, int, int]:
    """(row, part, parts) of work unit ``u``: row -1 when the unit is idle."""
    per = max(1, units // max(batch, 1))
    b = u // per
    return (b if b < batch else -1), u % per, per


def _infer_unit(op):
    q, cache, lens, pos, new = (v.type for v in op.operands)
    if q.rank != 3 or cache.rank != 3 or q.shape[2] != cache.shape[2]:
        fail(op, f"q {q}, cache {cache}", "q [B, G, W] and cache [B, S, W] of one width W")
    b, g, w = q.shape
    lat = op.attr("latent")
    if new.shape != (b, w) or not (isinstance(w, int) and lat < w):
        fail(op, f"new {new}, latent {lat}, width {w}", f"new [{b}, {w}] and latent < {w}")
    for t, what in ((lens, "seq_lens"), (pos, "positions")):
        if t.dtype != DType.i32 or t.shape != (b,):
            fail(op, f"{what} has type {t}", f"i32[{b}]")
    if not 0 < op.attr("scale") < F32_MAX:
        fail(op, f"scale = {op.attr('scale')}", "a scale > 0 that is finite in fp32")
    f32 = DType.f32
    return (q.with_shape((1, g)).with_dtype(f32), q.with_shape((1, g)).with_dtype(f32),
            q.with_shape((1, g, lat)).with_dtype(f32))


def _verify_unit(op, graph, module):
    """q and cache are parameters; ``unit`` numbers the CTAs of the launch 0 .. units - 1."""
    for v in op.operands[:2]:
        param_of(op, graph, v, "q and cache")
    if graph is None:
        return
    grid, size = graph.attr("grid"), graph.attr("cluster")
    got = sorted(op.attr("unit")(c, r) for c in range(grid) for r in range(size))
    if op.attr("units") != grid * size or got != list(range(grid * size)):
        fail(op, f"unit = \"{op.attr('unit')}\" with units = {op.attr('units')} on "
             f"{grid} x {size} CTAs", f"units = {grid * size} and a unit that numbers every "
             f"CTA once, e.g. \"{size}*cluster + rank\"")


def _too_many_rows(op, batch: int, units: int) -> None:
    if batch > units:
        raise SimulationError(f"batch {batch} over {units} work units (one row at most each)",
                              op=op.name, loc=op.loc,
                              valid=f"a batch <= {units} (the kernel's max_batch)")


def _simulate_unit(op, args, cta):
    _, _, lens, pos, new = (np.asarray(a) for a in args)
    name_q, name_c, lat = op.operands[0].name, op.operands[1].name, op.attr("latent")
    B = lens.shape[0]
    _too_many_rows(op, B, op.attr("units"))
    b, part, per = unit_row(op.attr("unit")(cta.cluster, cta.rank), op.attr("units"), B)
    G = op.operands[0].type.shape[1]
    m, l = np.full((1, G), -np.inf, np.float32), np.zeros((1, G), np.float32)
    o = np.zeros((1, G, lat), np.float32)
    if b < 0:
        return m, l, o
    n = min(max(int(lens[b]), 0), cta.memory.arrays[name_c].shape[1])
    lo, hi = chunk_range(n, part, per, op.attr("tile"))
    if hi <= lo:
        return m, l, o
    q = np.asarray(cta.memory.read(name_q, (b,), cta, op), np.float32)          # [G, W]
    rows = _rows(cta, op, name_c, b, lo, hi, int(pos[b]), new[b].astype(np.float32))
    s = (q @ rows.T) * np.float32(op.attr("scale"))
    m[0] = s.max(axis=1)
    p = np.exp(s - m[0][:, None])
    l[0] = p.sum(axis=1)
    o[0] = p @ rows[:, :lat]
    return m, l, o


def _cost_unit(op, env):
    q, cache = op.operands[0].type, op.operands[1].type
    b, g, w = q.concrete(env)
    rows = -(-b * env.get("S", cache.concrete(env)[1]) // op.attr("units"))  # tokens per unit
    return Cost(bytes_read=rows * w * cache.dtype.itemsize + g * w * q.dtype.itemsize,
                flops=2 * g * rows * (w + op.attr("latent")))


def _infer_merge(op):
    m, l, o, lens = (v.type for v in op.operands)
    if m != l or m.rank != 2 or o.rank != 3 or o.shape[:2] != m.shape or lens.rank != 1:
        fail(op, f"m {m}, l {l}, o {o}, seq_lens {lens}",
             "m, l: f32[units, G]; o: f32[units, G, D]; seq_lens: i32[B]")
    return (o.with_shape((lens.shape[0],) + o.shape[1:]),)


def _simulate_merge(op, args, cta):
    m, l, o = (np.asarray(a, np.float32) for a in args[:3])
    B = np.asarray(args[3]).shape[0]
    out = np.zeros((B,) + o.shape[1:], np.float32)
    if B == 0:
        return (out,)
    _too_many_rows(op, B, m.shape[0])
    per = max(1, m.shape[0] // B)
    for b in range(B):
        sl = slice(b * per, min((b + 1) * per, m.shape[0]))
        mm = m[sl].max(axis=0)
        with np.errstate(invalid="ignore"):
            e = np.where(np.isneginf(m[sl]), np.float32(0), np.exp(m[sl] - mm)).astype(np.float32)
        den = (e * l[sl]).sum(axis=0)
        num = (e[..., None] * o[sl]).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[b] = np.where(den[:, None] > 0, num / np.where(den > 0, den, 1)[:, None], 0)
    return (out,)


register(OpDef(
    "mla_attn_unit", __doc__, ("q", "cache", "seq_lens", "positions", "new"),
    (attr("unit", AFFINE), attr("units", POS_INT),
     attr("tile", POS_INT, 16, doc="tokens per cache tile; chunks are tile-aligned"),
     attr("scale", FLOAT), attr("latent", POS_INT, doc="value width: the latent part of a row")),
    _infer_unit, where=K, simulate=_simulate_unit, verify=_verify_unit, cost=_cost_unit))
register(OpDef("attn_merge", __doc__, ("m", "l", "o", "seq_lens"), (), _infer_merge, where=K,
               simulate=_simulate_merge))
