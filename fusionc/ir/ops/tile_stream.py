"""Tile IR: the shared-memory ring of a streamed kernel (design v2 §2).

``%r = ring_alloc() {rows} : dt[S, rows + xrows, cols]``
    A ring of ``S`` stages in shared memory, each holding one work unit's tiles: ``rows`` weight
    rows and ``xrows`` activation rows (the batch bucket) of a ``cols``-element K chunk, with a
    *full* and an *empty* mbarrier per stage (geometry: :class:`fusionc.stream.RingGeometry`).
``ring_claim(%r) {parity_offset = 0}`` (producer trait)
    The producer waits until the consumers released the current unit's stage from its previous
    fill (the stage's *empty* barrier at parity ``empty_parity(j)``; a no-op for the first ``S``
    units of the CTA).
``ring_wait(%r) {parity_offset = 0}``
    The consumers wait until the current unit's copies landed (the stage's *full* barrier at
    parity ``full_parity(j)``). On both waits ``parity_offset`` is added to the parity: 1 is a
    wrong (stale) parity, which the simulator reports (negative tests use it).
``ring_issue(%r, %w, %x)`` (producer trait)
    Arm the stage's full barrier with the stage's byte count and issue its 2D TMA boxes (tensor
    maps, 128-byte swizzle: :mod:`fusionc.stream.ring`): weight rows ``[g·rows, +rows)`` of
    ``%w`` and activation rows ``[0, xrows)`` of ``%x``, columns ``[s·cols, +cols)`` (unit
    ``u``: group ``g``, step ``s``); elements past N, K or the run-time batch arrive as zeros.
    ``split = I``: a paired tile, rows ``[g·rows/2, +rows/2)`` then ``[I + g·rows/2, +rows/2)``
    (four boxes of ``rows/2`` rows; the stage layout is that of one ``rows``-row box).
    ``head_rows, head_cols``: a block-diagonal linear's activation columns start at its head's
    (as ``acc_gemv``'s, which it copies them for; :func:`fusionc.stream.ring.head_column`).
``%tw, %tx = ring_stage(%r) : dt[rows, cols], dt[xrows, cols]``
    Views of the current unit's stage (no code); reading them is legal only between
    ``ring_wait {barrier = full}`` and ``ring_release``.
``ring_release(%r)``
    Each consumer warp arrives on the stage's empty barrier: the producer may refill it.
``fence_proxy_async()``
    ``fence.proxy.async.global``: orders this CTA's view of global data written with ordinary
    stores (acquired through a counter) before its later TMA reads of that data.

These ops are legal only inside a ``units`` region (``tile_units``); the simulator
(:mod:`fusionc.sim.grid`) runs them as a producer and a consumer coroutine per CTA and reports
a stage read before its copy completed, a stage overwritten before release, a stale parity, and
TMA reads of generically written data without the proxy fence.
"""
from __future__ import annotations

import math

from fusionc.ir.ops.tile_memory import K, param_of
from fusionc.ir.registry import NONNEG_INT, POS_INT, Cost, OpDef, attr, fail, register
from fusionc.ir.types import FLOAT_DTYPES
from fusionc.ir.ops.tile_units import HEADS


def _ring_of(op, graph, value):
    """VerifyError unless ``value`` comes from ring_alloc and ``op`` lies in the units region."""
    if graph is None:
        return
    from fusionc.ir.ops.stream_checks import inside_units
    inside_units(op, graph)
    from fusionc.ir.ops.tile_memory import def_of
    d = def_of(graph, value)
    if d is None or d.name != "ring_alloc":
        fail(op, f"%{value.name} is not a ring", "a result of ring_alloc()")


def _infer_alloc(op):
    if len(op.results) != 1:
        fail(op, "ring_alloc has one result", "%r = ring_alloc() {rows = R} : f16[S, R + X, C]")
    t = op.result.type
    rows = op.attr("rows")
    if t.rank != 3 or not t.is_static or t.dtype not in FLOAT_DTYPES:
        fail(op, f"ring of type {t}", "a static float type [stages, rows + xrows, cols]")
    if not 2 <= t.shape[0] <= 16 or rows >= t.shape[1]:
        fail(op, f"{t.shape[0]} stages, {rows} weight rows of {t.shape[1]}",
             "2 to 16 stages and fewer weight rows than rows per stage")
    if (t.shape[2] * t.dtype.itemsize) % 16:
        fail(op, f"rows of {t.shape[2]} elements ({t.shape[2] * t.dtype.itemsize} bytes)",
             "rows of a multiple of 16 bytes (TMA)")
    return (t,)


def _infer_stage(op):
    r = op.operands[0].type
    rows = op.attr("rows")
    if r.rank != 3 or not r.is_static or rows >= r.shape[1]:
        fail(op, f"ring {r} with {rows} weight rows", "a ring [stages, rows + xrows, cols] "
             "with fewer weight rows than rows per stage")
    return (r.with_shape((rows, r.shape[2])), r.with_shape((r.shape[1] - rows, r.shape[2])))


def _infer_issue(op):
    r, w, x = (v.type for v in op.operands)
    if r.rank != 3 or w.dtype != r.dtype or x.dtype != r.dtype:
        fail(op, f"ring {r}, w {w}, x {x}", "w: [N, K], x: [B, K] of the ring's dtype")
    if op.attr("head_rows"):
        from fusionc.ir.ops.tile_units import check_heads
        check_heads(op, x, w, w.shape[-1])
    elif w.rank != 2 or x.rank != 2 or w.shape[1] != x.shape[1]:
        fail(op, f"w {w} and x {x}", "w: [N, K] and x: [B, K], one K")
    for t, c, what in ((w, w.shape[-1], "K"), (x, x.shape[1:], "activation row")):
        c = math.prod(c) if isinstance(c, tuple) and all(isinstance(d, int) for d in c) else c
        if isinstance(c, int) and (c * t.dtype.itemsize) % 16:
            fail(op, f"{what} of {c} elements ({c * t.dtype.itemsize} bytes)",
                 "rows whose bytes are a multiple of 16 (else the plain-load path)")
    return ()


def _verify_issue(op, graph, module):
    _ring_of(op, graph, op.operands[0])
    for v, what in ((op.operands[1], "weight"), (op.operands[2], "activation")):
        param_of(op, graph, v, what)


def _cost_issue(op, env):
    r = op.operands[0].type
    return Cost(bytes_read=r.shape[1] * r.shape[2] * r.dtype.itemsize)


def _sim(method):
    """A simulator rule that hands the op to the CTA's stream state (``fusionc.sim.grid``)."""
    def rule(op, args, cta):
        stream = getattr(cta, "stream", None)
        if stream is None:
            from fusionc.errors import SimulationError
            raise SimulationError("a ring op outside a units region", op=op.name, loc=op.loc,
                                  valid="ring ops inside units() of a streamed kernel")
        return getattr(stream, method)(op, args)
    return rule


_ring = lambda op, g, m: _ring_of(op, g, op.operands[0])  # noqa: E731
STREAM = frozenset({"stream"})

register(OpDef("ring_alloc", __doc__, (), (attr("rows", POS_INT, doc="weight rows per stage"),),
               _infer_alloc, where=K, simulate=_sim("alloc"), traits=STREAM))
_parity = attr("parity_offset", NONNEG_INT, 0, omit=True, doc="added to the parity (tests)")
register(OpDef("ring_claim", __doc__, ("ring",), (_parity,), lambda op: (), where=K,
               simulate=_sim("claim"), verify=_ring, traits=frozenset({"stream", "producer"})))
register(OpDef("ring_wait", __doc__, ("ring",), (_parity,), lambda op: (), where=K,
               simulate=_sim("wait"), verify=_ring, traits=STREAM))
register(OpDef("ring_issue", __doc__, ("ring", "w", "x"),
               (attr("split", NONNEG_INT, 0, omit=True, doc="paired tile: the up rows' offset"),)
               + HEADS, _infer_issue, where=K,
               simulate=_sim("issue"), verify=_verify_issue, cost=_cost_issue,
               traits=frozenset({"stream", "producer"})))
register(OpDef("ring_stage", __doc__, ("ring",), (attr("rows", POS_INT),), _infer_stage, where=K,
               simulate=_sim("stage"), verify=_ring, traits=STREAM))
register(OpDef("ring_release", __doc__, ("ring",), (), lambda op: (), where=K,
               simulate=_sim("release"), verify=_ring, traits=STREAM))
from fusionc.ir.ops.tile_units import _WARP  # noqa: E402

def _verify_fence(op, graph, module):
    from fusionc.ir.ops.stream_checks import inside_units
    inside_units(op, graph)


register(OpDef("fence_proxy_async", __doc__, (), (_WARP,), lambda op: (), where=K,
               verify=_verify_fence,
               simulate=_sim("fence"), traits=STREAM))

