"""Tile IR: split-KV decode attention of one KV head per cluster, and the KV-cache append.

``attn_partial(%q, %k_cache, %v_cache, %seq_lens, %positions, %k_new, %v_new)
{kv_head, part, parts, tile, scale} -> (m: f32[B, G], l: f32[B, G], o: f32[B, G, D])``
    For batch row b with n = clamp(seq_lens[b], 0, max_seq) tokens, split into ``parts`` chunks of
    ``chunk = tile · ceil(ceil(n / parts) / tile)`` tokens, this CTA takes chunk ``part``:
    tokens t ∈ [part·chunk, min(n, (part+1)·chunk)). The token at t = positions[b] is the one
    appended in this launch: its key and value come from ``k_new``/``v_new`` (it is not visible
    in global memory yet). With s_t = scale · q[b, g] · k_t in fp32 (G query heads share KV head
    ``kv_head``):  m = max_t s_t,  l = Σ_t exp(s_t − m),  o = Σ_t exp(s_t − m) · v_t.
    An empty chunk gives (m, l, o) = (−inf, 0, 0). (Milakov & Gimelshein 2018, "Online
    normalizer calculation for softmax"; split-KV as in Flash-Decoding, Dao et al. 2023.)
``attn_rescale(%m, %l, %o, %m_max) -> f32[B, G, D + 1]``
    e = exp(m − m_max) (0 where m = −inf); returns [l·e, o·e] packed on the last axis, ready for
    one cluster_reduce(sum).
``attn_finish(%lo) -> f32[B, G, D]``
    o / l from the reduced pack; a row with l = 0 (no tokens) gives exactly 0, never NaN.
``kv_append(%cache, %x, %positions) {kv_head}`` (off-chip)
    cache[b, positions[b], kv_head, :] = x[b, :] for every row b, rounded to the cache dtype.
    Positions outside [0, max_seq) are skipped (never a fault). A cache of rank 3
    ``[B, S, D]`` (one row per token, e.g. MLA's latent cache) takes kv_head = 0.
"""

from __future__ import annotations

import numpy as np

from fusionc.ir.ops.tile_memory import K, param_of
from fusionc.ir.registry import AFFINE, FLOAT, POS_INT, Cost, OpDef, attr, fail, register
from fusionc.ir.types import DType


def chunk_range(n: int, part: int, parts: int, tile: int) -> tuple[int, int]:
    """Token range [lo, hi) of chunk ``part`` of ``parts`` over n tokens (tile-aligned)."""
    per = -(-n // parts) if n else 0
    chunk = tile * -(-per // tile)
    lo = min(n, part * chunk)
    return lo, min(n, lo + chunk)


def _infer_partial(op):
    q, kc, vc, lens, pos, kn, vn = (v.type for v in op.operands)
    if q.rank != 3 or kc.rank != 4 or kc != vc:
        fail(op, f"q {q}, caches {kc}, {vc}", "q: [B, G, D], caches [B, S, kv_heads, D]")
    b, g, d = q.shape
    if kc.shape[3] != d or kn.shape != (b, d) or vn.shape != (b, d):
        fail(
            op,
            f"head_dim of q {q}, caches {kc}, k_new {kn}, v_new {vn} differ",
            f"caches [.., {d}], k_new and v_new [{b}, {d}]",
        )
    for t, what in ((lens, "seq_lens"), (pos, "positions")):
        if t.dtype != DType.i32 or t.shape != (b,):
            fail(op, f"{what} has type {t}", f"i32[{b}]")
    if not 0 < op.attr("scale") < float("inf"):
        fail(op, f"scale = {op.attr('scale')}", "a finite scale > 0")
    f32 = DType.f32
    return (
        q.with_shape((b, g)).with_dtype(f32),
        q.with_shape((b, g)).with_dtype(f32),
        q.with_dtype(f32),
    )


def _sim_partial(op, args, cta):
    q, _, _, lens, pos, kn, vn = (np.asarray(a) for a in args)
    q, kn, vn = (x.astype(np.float32) for x in (q, kn, vn))
    kname, vname = op.operands[1].name, op.operands[2].name
    h = op.attr("kv_head")(cta.cluster, cta.rank)
    part = op.attr("part")(cta.cluster, cta.rank)
    B, G, D = q.shape
    m = np.full((B, G), -np.inf, np.float32)
    l = np.zeros((B, G), np.float32)
    o = np.zeros((B, G, D), np.float32)
    for b in range(B):
        n = min(max(int(lens[b]), 0), cta.memory.arrays[kname].shape[1])  # as the GPU clamps
        lo, hi = chunk_range(n, part, op.attr("parts"), op.attr("tile"))
        if hi <= lo:
            continue
        keys, vals = (
            _rows(cta, op, kname, b, lo, hi, h, int(pos[b]), kn[b]),
            _rows(cta, op, vname, b, lo, hi, h, int(pos[b]), vn[b]),
        )
        s = (q[b] @ keys.T) * np.float32(op.attr("scale"))  # [G, T]
        m[b] = s.max(axis=1)
        p = np.exp(s - m[b][:, None])
        l[b] = p.sum(axis=1)
        o[b] = p @ vals
    return m, l, o


def _rows(cta, op, name, b, lo, hi, h, pos, new):
    """Cache rows lo..hi of batch row b and head h in fp32, the appended token from ``new``."""
    out = np.empty((hi - lo, new.shape[0]), np.float32)
    inside = lo <= pos < hi
    for a, z in ((lo, pos), (pos + 1, hi)) if inside else ((lo, hi),):
        if z > a:
            out[a - lo : z - lo] = cta.memory.read(name, (b, slice(a, z), h, slice(None)), cta, op)
    if inside:
        out[pos - lo] = new
    return out


def _infer_rescale(op):
    m, l, o, mm = (v.type for v in op.operands)
    if m != l or m != mm or o.shape[:2] != m.shape or o.rank != 3:
        fail(op, f"m {m}, l {l}, o {o}, m_max {mm}", "m, l, m_max: f32[B, G]; o: f32[B, G, D]")
    return (o.with_shape(o.shape[:2] + (o.shape[2] + 1,)),)


def _sim_rescale(op, args, cta):
    m, l, o, mm = (np.asarray(a, np.float32) for a in args)
    with np.errstate(invalid="ignore"):
        e = np.where(np.isneginf(m), np.float32(0), np.exp(m - mm)).astype(np.float32)
    return (np.concatenate([(l * e)[..., None], o * e[..., None]], axis=-1),)


def _infer_finish(op):
    t = op.operands[0].type
    if t.rank != 3 or not isinstance(t.shape[2], int) or t.shape[2] < 2 or t.dtype != DType.f32:
        fail(op, f"operand {t}", "the reduced pack f32[B, G, D + 1] of attn_rescale")
    return (t.with_shape(t.shape[:2] + (t.shape[2] - 1,)),)


def _sim_finish(op, args, cta):
    lo = np.asarray(args[0], np.float32)
    l, o = lo[..., :1], lo[..., 1:]
    with np.errstate(invalid="ignore", divide="ignore"):
        return (np.where(l > 0, o / np.where(l > 0, l, 1), np.float32(0)).astype(np.float32),)


def _infer_append(op):
    c, x, pos = (v.type for v in op.operands)
    if c.rank not in (3, 4) or x.shape != (c.shape[0], c.shape[-1]):
        fail(op, f"cache {c}, x {x}", "cache [B, S, kv_heads, D] or [B, S, D], x [B, D]")
    if pos.dtype != DType.i32 or pos.shape != (c.shape[0],):
        fail(op, f"positions have type {pos}", f"i32[{c.shape[0]}]")
    return ()


def _sim_append(op, args, cta):
    cache = op.operands[0].name
    x, pos = np.asarray(args[1]), np.asarray(args[2])
    h = op.attr("kv_head")(cta.cluster, cta.rank)
    arr = cta.memory.arrays[cache]
    for b, p in enumerate(pos):
        if 0 <= p < arr.shape[1]:
            at = (b, int(p), h, slice(None)) if arr.ndim == 4 else (b, int(p), slice(None))
            cta.memory.write(cache, at, x[b], cta, op, op.operands[0].type.dtype)
    return ()


def _verify_append(op, graph, module):
    from fusionc.ir.ops.tile_memory import _verify_store

    _verify_store(op, graph, module)


def _cost_partial(op, env):
    """K and V of this CTA's chunk of S = env["S"] tokens per row, for all batch rows."""
    q, kc = op.operands[0].type, op.operands[1].type
    b, g, d = q.concrete(env)
    chunk = -(-env.get("S", kc.concrete(env)[1]) // op.attr("parts"))
    return Cost(bytes_read=2 * b * chunk * d * kc.dtype.itemsize, flops=4 * b * g * chunk * d)


def _cost_append(op, env):
    return Cost(
        bytes_written=op.operands[1].type.nbytes(env)
        // op.operands[1].type.dtype.itemsize
        * op.operands[0].type.dtype.itemsize
    )


register(
    OpDef(
        "attn_partial",
        __doc__,
        ("q", "k_cache", "v_cache", "seq_lens", "positions", "k_new", "v_new"),
        (
            attr("kv_head", AFFINE),
            attr("part", AFFINE),
            attr("parts", POS_INT),
            attr("tile", POS_INT, 16, doc="tokens per KV tile; chunks are tile-aligned"),
            attr("scale", FLOAT),
        ),
        _infer_partial,
        where=K,
        simulate=_sim_partial,
        verify=lambda op, g, m: [param_of(op, g, v, "cache") for v in op.operands[1:3]],
        cost=_cost_partial,
    )
)
register(
    OpDef(
        "attn_rescale",
        __doc__,
        ("m", "l", "o", "m_max"),
        (),
        _infer_rescale,
        where=K,
        simulate=_sim_rescale,
    )
)
register(OpDef("attn_finish", __doc__, ("lo",), (), _infer_finish, where=K, simulate=_sim_finish))
register(
    OpDef(
        "kv_append",
        __doc__,
        ("cache", "x", "positions"),
        (attr("kv_head", AFFINE),),
        _infer_append,
        where=K,
        simulate=_sim_append,
        verify=_verify_append,
        cost=_cost_append,
    )
)
