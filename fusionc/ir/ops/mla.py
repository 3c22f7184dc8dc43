"""Multi-head latent attention (MLA) for decode, in the weight-absorbed form (DeepSeek-AI 2024,
"DeepSeek-V2", arXiv 2405.04434, §2.1.2-2.1.3 and appendix C).

MLA caches, per token, one compressed latent c_KV (kv_lora_rank L = 512 in DeepSeek-V2) and one
decoupled RoPE key k_R (R = 64) shared by all heads, in one cache ``[B, max_seq, L + R]``
(c_KV first). Per head h the key is [W_UK_h c_KV ; k_R] and the value W_UV_h c_KV. Absorbing
W_UK into the query (q̃_h = W_UK_hᵀ q_nope_h, ``head_linear``) makes the score
s_t = scale · (q̃_h · c_KV,t + q_rope_h · k_R,t), and the attention output stays in the latent
space, õ_h = Σ_t softmax(s)_t c_KV,t (``mla_decode_attention``), to be expanded by W_UV_h
(``head_linear`` again) before the output projection. All sums in fp32.

head_linear: y[b, h, n] = Σ_k x[b, h, k] · w[h, n, k] (one [out, in] matrix per head).
latent_cache_append: cache[b, positions[b]] = [c[b] ; k_rope[b]]; returns the updated cache.
mla_decode_attention: as above over t < seq_lens[b]; a row with seq_lens[b] = 0 yields zeros.
"""
from __future__ import annotations

import numpy as np

from fusionc.ir.ops.attention import check_index, out_of_range
from fusionc.ir.registry import (FLOAT, FLOAT_DTYPES_TEXT, Cost, OpDef, attr, fail, register,
                                 same_dtype)
from fusionc.ir.types import FLOAT_DTYPES, TensorType

CACHE_FORM = "cache [batch, max_seq, latent + rope]"


def _infer_head_linear(op):
    x, w = (v.type for v in op.operands)
    same_dtype(op, x, w)
    if x.dtype not in FLOAT_DTYPES:
        fail(op, f"x has dtype {x.dtype}", FLOAT_DTYPES_TEXT)
    if x.rank != 3 or w.rank != 3 or w.shape[0] != x.shape[1] or w.shape[2] != x.shape[2]:
        fail(op, f"x {x} and w {w}", "x [B, heads, in], w [heads, out, in]")
    return (TensorType(x.dtype, (x.shape[0], x.shape[1], w.shape[1])),)


def _run_head_linear(op, args, ctx):
    x, w = (a.astype(ctx.acc) for a in args)
    return (np.einsum("bhk,hnk->bhn", x, w),)


def _head_linear_cost(op, env):
    x, w = (v.type for v in op.operands)
    b, h, k = x.concrete(env)
    n = w.concrete(env)[1]
    return Cost(bytes_read=x.nbytes(env) + w.nbytes(env),
                bytes_written=b * h * n * x.dtype.itemsize, flops=2 * b * h * n * k)


def _cache_parts(op, cache, latent):
    if cache.rank != 3 or cache.dtype not in FLOAT_DTYPES:
        fail(op, f"cache has type {cache}", f"{CACHE_FORM} of {FLOAT_DTYPES_TEXT}")
    width, lat = cache.shape[2], latent
    if not isinstance(width, int) or not isinstance(lat, int) or not 0 < lat < width:
        fail(op, f"latent dim {lat} with cache width {width}",
             "a static latent dim smaller than the cache width (latent + rope)")
    return lat, width - lat


def _infer_append(op):
    cache, c, kr, pos = (v.type for v in op.operands)
    same_dtype(op, cache, c, kr)
    if c.rank != 2 or kr.rank != 2:
        fail(op, f"c {c} and k_rope {kr}", "c [B, latent] and k_rope [B, rope], one row each")
    lat, rope = _cache_parts(op, cache, c.shape[-1] if c.rank == 2 else None)
    b = cache.shape[0]
    if c.shape != (b, lat) or kr.shape != (b, rope):
        fail(op, f"c {c} and k_rope {kr} do not fill the cache rows {cache}",
             f"c [{b}, {lat}] and k_rope [{b}, {rope}]")
    check_index(op, pos, "positions", b)
    return (cache,)


def _run_append(op, args, ctx):
    cache, c, kr, pos = args
    out_of_range(op, "positions", pos, cache.shape[1], hi_ok=False)
    cache = cache.copy()
    rows = np.arange(cache.shape[0])
    cache[rows, pos] = np.concatenate([c, kr], axis=-1)
    return (cache,)


def _infer_attention(op):
    ql, qr, cache, lens = (v.type for v in op.operands)
    same_dtype(op, ql, qr, cache)
    if ql.rank != 3 or qr.rank != 3 or ql.shape[:2] != qr.shape[:2]:
        fail(op, f"q_latent {ql} and q_rope {qr}", "q_latent [B, heads, L], q_rope [B, heads, R]")
    lat, rope = _cache_parts(op, cache, ql.shape[2])
    if qr.shape[2] != rope or cache.shape[0] != ql.shape[0]:
        fail(op, f"q_rope {qr} does not match the cache {cache}",
             f"q_rope [B, heads, {rope}] and the cache's batch B")
    check_index(op, lens, "seq_lens", ql.shape[0])
    if not 0 < op.attr("scale") < float(np.finfo(np.float32).max):
        fail(op, f"scale = {op.attr('scale')}",
             "a scale > 0, finite in fp32: 1/sqrt(qk_nope + qk_rope head dims) in DeepSeek-V2")
    return (ql,)


def _run_attention(op, args, ctx):
    """Per row: softmax over the first seq_lens[b] cached tokens; output in the latent space."""
    ql, qr, cache, lens = args
    out_of_range(op, "seq_lens", lens, cache.shape[1], hi_ok=True)
    lat = ql.shape[2]
    out = np.zeros(ql.shape, ctx.acc)
    scale = ctx.acc.type(op.attr("scale"))
    for b in range(ql.shape[0]):
        n = int(lens[b])
        if n == 0:
            continue
        kv = cache[b, :n].astype(ctx.acc)                                 # [n, L + R]
        s = (ql[b].astype(ctx.acc) @ kv[:, :lat].T + qr[b].astype(ctx.acc) @ kv[:, lat:].T)
        s = s * scale                                                     # [heads, n]
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        out[b] = (p @ kv[:, :lat]) / p.sum(axis=-1, keepdims=True)
    return (out,)


def _attention_cost(op, env):
    ql, cache = op.operands[0].type, op.operands[2].type
    b, h, lat = ql.concrete(env)
    s, width = cache.concrete(env)[1:]
    return Cost(bytes_read=2 * ql.nbytes(env) + b * s * width * cache.dtype.itemsize,
                bytes_written=ql.nbytes(env), flops=2 * b * h * s * (width + lat))


def _append_cost(op, env):
    c, kr = op.operands[1].type, op.operands[2].type
    return Cost(bytes_read=c.nbytes(env) + kr.nbytes(env),
                bytes_written=c.nbytes(env) + kr.nbytes(env))


register(OpDef("head_linear", __doc__, ("x", "w"), (), _infer_head_linear,
               interpret=_run_head_linear, cost=_head_linear_cost))
register(OpDef("latent_cache_append", __doc__, ("cache", "c", "k_rope", "positions"), (),
               _infer_append, interpret=_run_append, cost=_append_cost))
register(OpDef("mla_decode_attention", __doc__, ("q_latent", "q_rope", "cache", "seq_lens"),
               (attr("scale", FLOAT, doc="softmax scale: 1/sqrt(qk_nope + qk_rope)"),),
               _infer_attention, interpret=_run_attention, cost=_attention_cost))
