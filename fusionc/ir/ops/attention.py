"""KV-cache append and decode attention (MHA and GQA).

KV cache layout: ``[batch, max_seq, kv_heads, head_dim]``, one row per sequence of the batch,
token t of row b at ``cache[b, t]``. Queries ``q: [batch, heads, head_dim]`` (one new token per
row). GQA: heads = kv_heads · group; query head h reads KV head h // group (Ainslie et al. 2023,
"GQA", §2).

decode_attention: for row b with n = seq_lens[b] valid tokens,
    s_t = scale · q_h · k_t,   o_h = Σ_t softmax(s)_t · v_t,   t < n
(Vaswani et al. 2017, eq. 1), accumulated in fp32; a row with n = 0 yields zeros. Entries of the
cache at t >= n are never read (they may hold garbage or NaN).

kv_cache_append: writes k[b], v[b] at cache position positions[b] and returns the updated caches
(in place on the GPU).
"""
from __future__ import annotations

import math

import numpy as np

from fusionc.errors import InputError
from fusionc.ir.registry import (FLOAT, FLOAT_DTYPES_TEXT, Cost, OpDef, attr, fail, register,
                                 same_dtype)
from fusionc.ir.types import FLOAT_DTYPES, DType

CACHE_FORM = "caches [batch, max_seq, kv_heads, head_dim]"


def _check_caches(op, kc, vc):
    if kc != vc or kc.rank != 4:
        fail(op, f"k_cache {kc} and v_cache {vc}", f"equal types, {CACHE_FORM}")
    if kc.dtype not in FLOAT_DTYPES:
        fail(op, f"caches have dtype {kc.dtype}", FLOAT_DTYPES_TEXT)


def check_index(op, t, what, batch):
    if t.dtype != DType.i32 or t.shape != (batch,):
        fail(op, f"{what} has type {t}", f"i32[{batch}]")


def _distinct(op):
    """The K and V caches are two tensors (one value as both is always a mistake: the V
    rows would overwrite the K rows)."""
    i = 1 if op.name == "decode_attention" else 0   # q comes first in decode_attention
    kc, vc = op.operands[i], op.operands[i + 1]
    if kc.name == vc.name:
        fail(op, f"%{kc.name} is both the K and the V cache", "two distinct cache tensors")


def _append(op):
    kc, vc, k, v, pos = (x.type for x in op.operands)
    _check_caches(op, kc, vc)
    _distinct(op)
    same_dtype(op, kc, k, v)
    want = (kc.shape[0], kc.shape[2], kc.shape[3])
    if k != v or k.shape != want:
        fail(op, f"k {k} and v {v} do not match the caches {kc}",
             f"k, v of shape [{', '.join(map(str, want))}]")
    check_index(op, pos, "positions", kc.shape[0])
    return (kc, vc)


def _attention(op):
    q, kc, vc, lens = (x.type for x in op.operands)
    _check_caches(op, kc, vc)
    _distinct(op)
    same_dtype(op, q, kc)
    if q.rank != 3:
        fail(op, f"q has type {q}", "q: [batch, heads, head_dim]")
    b, h, d = q.shape
    if kc.shape[0] != b or kc.shape[3] != d:
        fail(op, f"q {q} does not match caches {kc}",
             f"{CACHE_FORM} with batch {b} and head_dim {d}")
    hkv = kc.shape[2]
    if not isinstance(h, int) or not isinstance(hkv, int) or h % hkv:
        fail(op, f"num_kv_heads = {hkv} does not divide num_heads = {h}",
             "num_heads a multiple of num_kv_heads (MHA: equal; GQA: a whole group per KV head)")
    check_index(op, lens, "seq_lens", b)
    if not 0 < op.attr("scale") < math.inf:
        fail(op, f"scale = {op.attr('scale')}", "a finite scale > 0, usually 1/sqrt(head_dim)")
    return (q,)


def out_of_range(op, what, idx, limit, hi_ok):
    """InputError unless 0 <= idx[b] < limit (<= limit when ``hi_ok``) for every row b."""
    bad = (idx < 0) | ((idx > limit) if hi_ok else (idx >= limit))
    if bad.any():
        b = int(np.argmax(bad))
        raise InputError(f"{what}[{b}] = {int(idx[b])} is outside the cache", op=op.name,
                         loc=op.loc, valid=f"0 <= {what} {'<=' if hi_ok else '<'} {limit}")


def _run_append(op, args, ctx):
    kc, vc, k, v, pos = args
    out_of_range(op, "positions", pos, kc.shape[1], hi_ok=False)
    rows = np.arange(kc.shape[0])
    kc, vc = kc.copy(), vc.copy()
    kc[rows, pos] = k
    vc[rows, pos] = v
    return kc, vc


def _run_attention(op, args, ctx):
    """Per row: softmax over the first seq_lens[b] cached tokens, GQA by head groups."""
    q, kc, vc, lens = args
    out_of_range(op, "seq_lens", lens, kc.shape[1], hi_ok=True)
    b_, h, d = q.shape
    hkv = kc.shape[2]
    out = np.zeros((b_, h, d), ctx.acc)
    scale = ctx.acc.type(op.attr("scale"))
    for b in range(b_):
        n = int(lens[b])
        if n == 0:
            continue  # an empty row yields zeros
        k, v = kc[b, :n].astype(ctx.acc), vc[b, :n].astype(ctx.acc)   # [n, hkv, d]
        qg = q[b].astype(ctx.acc).reshape(hkv, h // hkv, d)            # head h -> h // group
        s = np.einsum("kgd,nkd->kgn", qg, k) * scale
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        o = np.einsum("kgn,nkd->kgd", p, v) / p.sum(axis=-1, keepdims=True)
        out[b] = o.reshape(h, d)
    return (out,)


def _attention_cost(op, env, kv_len: int | None = None):
    """Bytes: q, o, and the K and V of ``kv_len`` tokens per row (default: max_seq)."""
    q, kc = op.operands[0].type, op.operands[1].type
    b, h, d = q.concrete(env)
    s = kv_len if kv_len is not None else kc.concrete(env)[1]
    kv = 2 * b * s * kc.shape[2] * d * kc.dtype.itemsize
    return Cost(bytes_read=q.nbytes(env) + kv, bytes_written=q.nbytes(env), flops=4 * b * h * s * d)


def _append_cost(op, env):
    k = op.operands[2].type
    return Cost(bytes_read=2 * k.nbytes(env), bytes_written=2 * k.nbytes(env))


register(OpDef("kv_cache_append", __doc__, ("k_cache", "v_cache", "k", "v", "positions"), (),
               _append, interpret=_run_append, cost=_append_cost))
register(OpDef("decode_attention", __doc__, ("q", "k_cache", "v_cache", "seq_lens"),
               (attr("scale", FLOAT, doc="softmax scale, usually 1/sqrt(head_dim)"),),
               _attention, interpret=_run_attention, cost=_attention_cost))
