"""A numpy emulation of the peer-to-peer all-reduce kernel (:mod:`fusionc.comm.kernel`): W
ranks × ``ctas`` CTAs run the kernel's program — pushes into peers' slots, flag signals, flag
waits, reductions — over a sequence of calls, interleaved by a scheduler in a random order. As
on the GPU, a rank starts call n+1 only when all its CTAs finished call n (stream order), but
ranks drift apart freely; slots alternate by the parity of the epoch, flags are never reset.

It is the executable definition of the protocol: ``ProtocolError`` is raised for a read of a
slot row that its peer CTA did not push in this call, or pushed but signalled only after the
count the reader waited for; for a push that overwrites a row its reader has not read yet (the
slot-reuse rule); and for a deadlock. Arithmetic follows the kernel (fp32 sums in rank order,
the unfused roundings).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from fusionc.interp.numerics import round_to
from fusionc.ir.ops.comm import token_shards
from fusionc.ir.ops.norm import rms_norm_values
from fusionc.ir.types import DType


class ProtocolError(AssertionError):
    """The emulated kernel broke its own protocol (a bug in the algorithm, not in the input)."""


@dataclass
class Call:
    """One collective: every rank's ``xs[r]`` ``[T, D]``, the replicated residual and weight
    (None: not fused), the algorithm and the rows per chunk."""

    xs: list
    residual: object = None
    weight: object = None
    two_shot: bool = False
    chunk: int = 2


class _State:
    def __init__(self, world: int, ctas: int):
        self.W, self.ctas = world, ctas
        self.slot: dict = {}      # (dst, src, parity, row) -> values
        self.mark: dict = {}      # same key -> [cta, phase, count, epoch, read]
        self.pending: dict = {}   # (src, cta, phase) -> keys pushed since the last signal
        self.flags: dict = {}     # (phase, dst, src, cta) -> (epoch, count)


def emulate(xs, residual=None, weight=None, eps: float = 1e-5, *, dtype: str = "f16",
            ctas: int = 4, chunk: int = 2, two_shot: bool = False, seed: int = 0):
    """One call. ``xs``: one ``[T, D]`` array per rank (values of ``dtype``); returns one
    ``(y, h)`` per rank (``y`` None without ``weight``), float32.

    Raises:
        ProtocolError: see the module docstring.
    """
    return emulate_calls([Call(list(xs), residual, weight, two_shot, chunk)], eps,
                         dtype=dtype, ctas=ctas, seed=seed)[0]


def emulate_calls(calls: list[Call], eps: float = 1e-5, *, dtype: str = "f16", ctas: int = 4,
                  seed: int = 0) -> list:
    """Several calls on one communicator (token counts, algorithms and chunks may change from
    call to call); returns, per call, one ``(y, h)`` per rank.

    Raises:
        ProtocolError: see the module docstring.
    """
    world = len(calls[0].xs)
    st = _State(world, ctas)
    results = []
    ctxs = []
    for n, c in enumerate(calls):
        xs = [np.asarray(x, np.float32) for x in c.xs]
        outs = [(np.full_like(xs[0], np.nan), np.full_like(xs[0], np.nan)) for _ in xs]
        ctxs.append({"xs": xs, "res": c.residual, "w": c.weight, "eps": eps, "dt": DType[dtype],
                     "chunk": c.chunk, "outs": outs, "e": n + 1, "two": c.two_shot})
        results.append([(y if c.weight is not None else None, h) for y, h in outs])
    _run(st, ctxs, random.Random(seed))
    return results


def _run(st, ctxs, rng) -> None:
    """Advance the CTA programs in random order; each yields (phase, count) waits. Rank r's
    programs of call n+1 start when all of its programs of call n have ended."""
    call = [0] * st.W
    live = {}

    def advance(key, g):
        w = next(g, None)
        if w is not None:
            live[key] = (g, w)
            return
        live.pop(key, None)
        r = key[0]
        if not any(k[0] == r for k in live) and call[r] + 1 < len(ctxs):
            call[r] += 1
            start(r)

    def start(r):
        ctx = ctxs[call[r]]
        for b in range(st.ctas):
            advance((r, b), (_two_shot if ctx["two"] else _one_shot)(st, ctx, r, b))

    for r in range(st.W):
        start(r)
    while live:
        ready = [k for k, (_, w) in live.items() if _satisfied(st, *k, ctxs[call[k[0]]]["e"], *w)]
        if not ready:
            raise ProtocolError(f"deadlock: waits {[(k, w) for k, (_, w) in live.items()]}")
        key = rng.choice(ready)
        advance(key, live[key][0])


def _satisfied(st, r, b, e, phase, k) -> bool:
    for q in range(st.W):
        if q != r:
            fe, fk = st.flags.get((phase, r, q, b), (0, 0))
            if not (fe > e or (fe == e and fk >= k)):
                return False
    return True


def _chunk_rows(g, chunk, first, count):
    return [first + g * chunk + i for i in range(chunk) if g * chunk + i < count]


def _push(st, ctx, r, b, phase, rows, values, dst=None):
    par = ctx["e"] & 1
    for q in range(st.W):
        if q != r and (dst is None or q == dst):
            for row in rows:
                key = (q, r, par, row)
                old = st.mark.get(key)
                if old is not None and not old[4]:
                    raise ProtocolError(f"rank {r} CTA {b} overwrote row {row} of its slot on "
                                        f"rank {q} (epoch {ctx['e']}) before rank {q} read the "
                                        f"epoch-{old[3]} data")
                st.slot[key] = np.array(values[row])
                st.mark[key] = [b, phase, 0, ctx["e"], False]
                st.pending.setdefault((r, b, phase), []).append(key)


def _signal(st, ctx, r, b, phase, k):
    for key in st.pending.pop((r, b, phase), []):
        st.mark[key][2] = k
    for q in range(st.W):
        if q != r:
            st.flags[(phase, q, r, b)] = (ctx["e"], k)


def _read(st, ctx, r, b, src, row, phase, waited):
    key = (r, src, ctx["e"] & 1, row)
    cta, ph, k, epoch, _ = st.mark.get(key, [-1, -1, 0, -1, True])
    if cta != b or ph != phase or epoch != ctx["e"] or not 0 < k <= waited:
        raise ProtocolError(f"rank {r} CTA {b} read row {row} from rank {src} in epoch "
                            f"{ctx['e']}: pushed by CTA {cta} in phase {ph}, epoch {epoch}, "
                            f"count {k}; waited for {waited}")
    st.mark[key][4] = True
    return st.slot[key]


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
            v = ctx["xs"][r][row] if q == r else _read(st, ctx, r, b, q, row, phase, waited)
            s = v.copy() if s is None else s + v
        out[row] = s
    return out


def _one_shot(st, ctx, r, b):
    T, ch, nb = len(ctx["xs"][r]), ctx["chunk"], st.ctas
    nch = -(-T // ch)
    nk = (nch - 1 - b) // nb + 1 if b < nch else 0
    x = ctx["xs"][r]
    for k in range(nk):
        if k == 0:
            _push(st, ctx, r, b, 0, _chunk_rows(b, ch, 0, T), x)
            _signal(st, ctx, r, b, 0, 1)
        if k + 1 < nk:
            _push(st, ctx, r, b, 0, _chunk_rows(b + (k + 1) * nb, ch, 0, T), x)
            _signal(st, ctx, r, b, 0, k + 2)
        yield (0, k + 1)
        rows = _chunk_rows(b + k * nb, ch, 0, T)
        _finish(ctx, r, rows, _sum_rows(st, ctx, r, b, rows, 0, k + 1))
    if nk == 0:
        _signal(st, ctx, r, b, 0, 0)
        yield (0, 0)


def _two_shot(st, ctx, r, b):
    T, ch, nb, W = len(ctx["xs"][r]), ctx["chunk"], st.ctas, st.W
    shards = token_shards(T, W)
    nch = -(-(-(-T // W)) // ch)
    nk = (nch - 1 - b) // nb + 1 if b < nch else 0
    x = ctx["xs"][r]

    def push(g):
        for q in range(W):
            if q != r:
                s = shards[q]
                _push(st, ctx, r, b, 0, _chunk_rows(g, ch, s.start, s.stop - s.start), x, q)

    mine = shards[r]
    for k in range(nk):
        if k == 0:
            push(b)
            _signal(st, ctx, r, b, 0, 1)
        if k + 1 < nk:
            push(b + (k + 1) * nb)
            _signal(st, ctx, r, b, 0, k + 2)
        yield (0, k + 1)
        rows = _chunk_rows(b + k * nb, ch, mine.start, mine.stop - mine.start)
        _finish(ctx, r, rows, _sum_rows(st, ctx, r, b, rows, 0, k + 1))
        _push(st, ctx, r, b, 1, rows, ctx["outs"][r][1])
        _signal(st, ctx, r, b, 1, k + 1)
    for k in range(nk):
        yield (1, k + 1)
        for q in range(W):
            if q != r:
                s = shards[q]
                for row in _chunk_rows(b + k * nb, ch, s.start, s.stop - s.start):
                    _store(ctx, r, row, _read(st, ctx, r, b, q, row, 1, k + 1).copy())
    if nk == 0:
        _signal(st, ctx, r, b, 0, 0)
        yield (0, 0)
