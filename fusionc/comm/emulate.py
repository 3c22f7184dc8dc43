"""A numpy emulation of the peer-to-peer all-reduce kernel (:mod:`fusionc.comm.kernel`): W
ranks × ``ctas`` CTAs run the kernel's program — pushes into peers' slots, flag signals, flag
waits, reductions — interleaved by a scheduler in a random order. It is the executable
definition of the protocol: a read of a slot row that its peer CTA did not push, or pushed but
signalled only after the count the reader waited for, raises ``ProtocolError``; so does a
deadlock. Arithmetic follows the kernel (fp32 sums in rank order, the unfused roundings).
"""
from __future__ import annotations

import random

import numpy as np

from fusionc.interp.numerics import round_to
from fusionc.ir.ops.comm import token_shards
from fusionc.ir.ops.norm import rms_norm_values
from fusionc.ir.types import DType


class ProtocolError(AssertionError):
    """The emulated kernel broke its own protocol (a bug in the algorithm, not in the input)."""


class _State:
    def __init__(self, xs, ctas):
        W, (T, D) = len(xs), xs[0].shape
        self.W, self.T, self.D, self.ctas = W, T, D, ctas
        self.slot = np.full((W, W, T, D), np.nan, np.float32)   # [dst, src, row]
        self.mark = -np.ones((W, W, T, 3), np.int64)             # (cta, phase, count) per row
        self.pending = {}                                        # (src, b, phase) -> rows
        self.flags = np.zeros((2, W, W, ctas), np.int64)         # [phase, dst, src, cta]


def emulate(xs, residual=None, weight=None, eps: float = 1e-5, *, dtype: str = "f16",
            ctas: int = 4, chunk: int = 2, two_shot: bool = False, seed: int = 0):
    """Run the kernel's schedule. ``xs``: one ``[T, D]`` array per rank (values of ``dtype``);
    returns one ``(y, h)`` per rank (``y`` None without ``weight``), in float32."""
    dt = DType[dtype]
    xs = [np.asarray(x, np.float32) for x in xs]
    st = _State(xs, ctas)
    outs = [(np.full_like(xs[0], np.nan), np.full_like(xs[0], np.nan)) for _ in xs]
    ctx = {"xs": xs, "res": residual, "w": weight, "eps": eps, "dt": dt, "chunk": chunk,
           "outs": outs}
    progs = [(r, b, (_two_shot if two_shot else _one_shot)(st, ctx, r, b))
             for r in range(st.W) for b in range(ctas)]
    _run(st, progs, random.Random(seed))
    return [(y if weight is not None else None, h) for y, h in outs]


def _run(st, progs, rng) -> None:
    """Advance the CTA programs in random order; each yields (phase, count) waits."""
    waiting = {}
    live = list(progs)
    for r, b, g in live:
        waiting[(r, b)] = next(g, None)
    while True:
        ready = [(r, b, g) for r, b, g in live if waiting[(r, b)] is not None and
                 _satisfied(st, r, b, *waiting[(r, b)])]
        if not ready:
            if any(waiting[(r, b)] is not None for r, b, _ in live):
                raise ProtocolError(f"deadlock: waits {waiting}")
            return
        r, b, g = rng.choice(ready)
        waiting[(r, b)] = next(g, None)


def _satisfied(st, r, b, phase, k) -> bool:
    return all(st.flags[phase, r, q, b] >= k for q in range(st.W) if q != r)


def _chunk_rows(g, chunk, first, count):
    return [first + g * chunk + i for i in range(chunk) if g * chunk + i < count]


def _push(st, r, b, phase, rows, values, dst=None):
    for q in range(st.W):
        if q != r and (dst is None or q == dst):
            for row in rows:
                st.slot[q, r, row] = values[row]
                st.pending.setdefault((r, b, phase), []).append((q, row))


def _signal(st, r, b, phase, k):
    for q, row in st.pending.pop((r, b, phase), []):
        st.mark[q, r, row] = (b, phase, k)
    for q in range(st.W):
        if q != r:
            st.flags[phase, q, r, b] = k


def _read(st, r, b, src, row, phase, waited):
    cta, ph, k = st.mark[r, src, row]
    if cta != b or ph != phase or not 0 < k <= waited:
        raise ProtocolError(f"rank {r} CTA {b} read row {row} from rank {src}: pushed by CTA "
                            f"{cta} in phase {ph} with count {k}, waited for {waited}")
    return st.slot[r, src, row]


def _finish(ctx, r, rows, sums):
    """h and y of ``rows`` from their fp32 sums (the kernel's roundings), into rank r's outputs."""
    dt = ctx["dt"]
    for row in rows:
        s = round_to(sums[row], dt).astype(np.float32)
        if ctx["res"] is not None:
            s = round_to(s + np.asarray(ctx["res"][row], np.float32), dt).astype(np.float32)
        _store(ctx, r, row, s)


def _store(ctx, r, row, hrow):
    dt, (y, h) = ctx["dt"], ctx["outs"][r]
    h[row] = hrow
    if ctx["w"] is not None:
        yr = rms_norm_values(hrow[None], np.asarray(ctx["w"], np.float32), ctx["eps"], np.float32)
        y[row] = round_to(yr[0], dt)


def _sum_rows(st, ctx, r, b, rows, phase, waited):
    out = {}
    for row in rows:
        s = None
        for q in range(st.W):
            v = ctx["xs"][r][row] if q == r else _read(st, r, b, q, row, phase, waited)
            s = v.copy() if s is None else s + v
        out[row] = s
    return out


def _one_shot(st, ctx, r, b):
    T, ch, nb = st.T, ctx["chunk"], st.ctas
    nch = -(-T // ch)
    nk = (nch - 1 - b) // nb + 1 if b < nch else 0
    x = ctx["xs"][r]
    for k in range(nk):
        if k == 0:
            _push(st, r, b, 0, _chunk_rows(b, ch, 0, T), x)
            _signal(st, r, b, 0, 1)
        if k + 1 < nk:
            _push(st, r, b, 0, _chunk_rows(b + (k + 1) * nb, ch, 0, T), x)
            _signal(st, r, b, 0, k + 2)
        yield (0, k + 1)
        rows = _chunk_rows(b + k * nb, ch, 0, T)
        _finish(ctx, r, rows, _sum_rows(st, ctx, r, b, rows, 0, k + 1))
    if nk == 0:
        _signal(st, r, b, 0, 0)
        yield (0, 0)


def _two_shot(st, ctx, r, b):
    T, ch, nb, W = st.T, ctx["chunk"], st.ctas, st.W
    shards = token_shards(T, W)
    per = -(-T // W)
    nch = -(-per // ch)
    nk = (nch - 1 - b) // nb + 1 if b < nch else 0
    x = ctx["xs"][r]

    def push(g):
        for q in range(W):
            if q != r:
                s = shards[q]
                _push(st, r, b, 0, _chunk_rows(g, ch, s.start, s.stop - s.start), x, dst=q)

    mine = shards[r]
    for k in range(nk):
        if k == 0:
            push(b)
            _signal(st, r, b, 0, 1)
        if k + 1 < nk:
            push(b + (k + 1) * nb)
            _signal(st, r, b, 0, k + 2)
        yield (0, k + 1)
        rows = _chunk_rows(b + k * nb, ch, mine.start, mine.stop - mine.start)
        _finish(ctx, r, rows, _sum_rows(st, ctx, r, b, rows, 0, k + 1))
        _push(st, r, b, 1, rows, ctx["outs"][r][1])
        _signal(st, r, b, 1, k + 1)
    for k in range(nk):
        yield (1, k + 1)
        for q in range(W):
            if q != r:
                s = shards[q]
                for row in _chunk_rows(b + k * nb, ch, s.start, s.stop - s.start):
                    _store(ctx, r, row, _read(st, r, b, q, row, 1, k + 1).copy())
    if nk == 0:
        _signal(st, r, b, 0, 0)
        yield (0, 0)
