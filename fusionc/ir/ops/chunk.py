"""Many new tokens per sequence (a prompt processed in chunks): a KV-cache write and attention
for rows that map to sequences.

Rows ``t`` of a chunk are new tokens; ``seq_of[t]`` is the sequence (the cache's batch row) of
token t and ``positions[t]`` its position in that sequence. The rows of one sequence are
consecutive and at consecutive positions (checked when the graph runs: they are run-time
values). KV cache layout as for decoding: ``[batch, max_seq, kv_heads, head_dim]``.

kv_cache_write: ``cache[seq_of[t], positions[t]] = k[t]`` (and v), for every row; returns the
updated caches (in place on the GPU).

chunk_attention: row t attends over its sequence's cache up to its own position,
    n_t = positions[t] + 1,   s_j = scale · q_h · k_j,   o_h = Σ_{j<n_t} softmax(s)_j · v_j
(Vaswani et al. 2017, eq. 1; GQA as in decode_attention), accumulated in fp32. Causal within the
chunk: after kv_cache_write of the chunk, the cache holds every earlier token of the sequence,
the chunk's among them, and row t reads only positions <= its own.
"""
from __future__ import annotations

import math

import numpy as np

from fusionc.errors import InputError
from fusionc.ir.ops.attention import CACHE_FORM, _check_caches, check_index, out_of_range
from fusionc.ir.registry import FLOAT, Cost, OpDef, attr, fail, register, same_dtype


def _rows(op, kc, k, v, seq_of, positions):
    want = (kc.shape[2], kc.shape[3])
    if k != v or k.rank != 3 or k.shape[1:] != want:
        fail(op, f"k {k} and v {v} do not match the caches {kc}",
             f"k, v of shape [T, {', '.join(map(str, want))}] (T new tokens)")
    check_index(op, seq_of, "seq_of", k.shape[0])
    check_index(op, positions, "positions", k.shape[0])


def _write(op):
    kc, vc, k, v, seq_of, pos = (x.type for x in op.operands)
    _check_caches(op, kc, vc)
    same_dtype(op, kc, k, v)
    _rows(op, kc, k, v, seq_of, pos)
    return (kc, vc)


def _attention(op):
    q, kc, vc, seq_of, pos = (x.type for x in op.operands)
    _check_caches(op, kc, vc)
    same_dtype(op, q, kc)
    if q.rank != 3 or q.shape[2] != kc.shape[3]:
        fail(op, f"q {q} for caches {kc}", f"q: [T, heads, {kc.shape[3]}], {CACHE_FORM}")
    h, hkv = q.shape[1], kc.shape[2]
    if not isinstance(h, int) or not isinstance(hkv, int) or h % hkv:
        fail(op, f"num_kv_heads = {hkv} does not divide num_heads = {h}",
             "num_heads a multiple of num_kv_heads (MHA: equal; GQA: a whole group per KV head)")
    check_index(op, seq_of, "seq_of", q.shape[0])
    check_index(op, pos, "positions", q.shape[0])
    if not 0 < op.attr("scale") < math.inf:
        fail(op, f"scale = {op.attr('scale')}", "a finite scale > 0, usually 1/sqrt(head_dim)")
    return (q,)


def check_rows(op, seq_of: np.ndarray, positions: np.ndarray, batch: int, max_seq: int) -> None:
    """InputError unless every row's sequence is a cache row, its position lies inside the
    cache, and the rows of one sequence are consecutive at consecutive positions."""
    out_of_range(op, "seq_of", seq_of, batch, hi_ok=False)
    out_of_range(op, "positions", positions, max_seq, hi_ok=False)
    seen = set()
    for t in range(len(seq_of)):
        s = int(seq_of[t])
        if t and s == int(seq_of[t - 1]):
            if int(positions[t]) != int(positions[t - 1]) + 1:
                raise InputError(f"rows {t - 1} and {t} of sequence {s} at positions "
                                 f"{int(positions[t - 1])} and {int(positions[t])}", op=op.name,
                                 loc=op.loc, valid="consecutive positions within a sequence")
            continue
        if s in seen:
            raise InputError(f"sequence {s} in two runs of rows (row {t})", op=op.name,
                             loc=op.loc, valid="the rows of one sequence consecutive")
        seen.add(s)


def _run_write(op, args, ctx):
    kc, vc, k, v, seq_of, pos = args
    check_rows(op, seq_of, pos, kc.shape[0], kc.shape[1])
    kc, vc = kc.copy(), vc.copy()
    kc[seq_of, pos] = k
    vc[seq_of, pos] = v
    return kc, vc


def _run_attention(op, args, ctx):
    q, kc, vc, seq_of, pos = args
    check_rows(op, seq_of, pos, kc.shape[0], kc.shape[1])
    t_, h, d = q.shape
    hkv = kc.shape[2]
    out = np.zeros((t_, h, d), ctx.acc)
    scale = ctx.acc.type(op.attr("scale"))
    for t in range(t_):
        s_, n = int(seq_of[t]), int(pos[t]) + 1
        k, v = kc[s_, :n].astype(ctx.acc), vc[s_, :n].astype(ctx.acc)   # [n, hkv, d]
        qg = q[t].astype(ctx.acc).reshape(hkv, h // hkv, d)
        s = np.einsum("kgd,nkd->kgn", qg, k) * scale
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        out[t] = (np.einsum("kgn,nkd->kgd", p, v) / p.sum(axis=-1, keepdims=True)).reshape(h, d)
    return (out,)


def _attention_cost(op, env):
    """Bytes: q, o, and K and V of the whole cache row of each row's sequence read once per
    row (an upper bound: a lowering that shares a sequence's tiles among its rows reads less)."""
    q, kc = op.operands[0].type, op.operands[1].type
    t, h, d = q.concrete(env)
    s = kc.concrete(env)[1]
    kv = 2 * t * s * kc.shape[2] * d * kc.dtype.itemsize
    return Cost(bytes_read=q.nbytes(env) + kv, bytes_written=q.nbytes(env), flops=4 * t * h * s * d)


def _write_cost(op, env):
    k = op.operands[2].type
    return Cost(bytes_read=2 * k.nbytes(env), bytes_written=2 * k.nbytes(env))


register(OpDef("kv_cache_write", __doc__,
               ("k_cache", "v_cache", "k", "v", "seq_of", "positions"), (), _write,
               interpret=_run_write, cost=_write_cost))
register(OpDef("chunk_attention", __doc__, ("q", "k_cache", "v_cache", "seq_of", "positions"),
               (attr("scale", FLOAT, doc="softmax scale, usually 1/sqrt(head_dim)"),),
               _attention, interpret=_run_attention, cost=_attention_cost))
