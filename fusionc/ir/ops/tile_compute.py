"""Tile IR: per-CTA compute — GEMV partial products, in-CTA reductions, control.

``gemv(%x, %w) {row, col, rows, masked} : f32[..., rows]``
    Partial product of a weight tile streamed from global memory:
    y[..., n] = Σ_k x[..., k] · w[row + n, col + k] for k < K (K = last dim of x), with
    fp32 accumulation. A weight of rank > 2 (one matrix per head, ``[heads, N, K]``) is read as
    its row-major flattening ``[heads·N, K]``. The CTA reads each weight element of its tile
    once for all batch rows.
    With ``masked``, weight elements outside ``w`` count as 0 (K and N tails).
``reduce(%x) {op = sum|max|sumsq, axis} : f32[...]``
    In-CTA reduction over one axis (removed), fp32.
``norm_apply(%x, %w, %ss) {eps, dim} : like x``
    The second half of a split RMSNorm: y = w · x · rsqrt(ss / dim + eps), where ss (fp32, one
    per row) is the sum of squares over the whole row of ``dim`` elements (reduced over the
    cluster) and x, w are this CTA's slice; computed in fp32, rounded to the dtype of x.
``when() {on = rank|cluster, lo, hi} ({ ... })``
    Runs its region only on CTAs with lo <= rank (or cluster id) < hi. A region conditioned on
    the rank must not contain collectives (peers would wait forever).
``exit()``
    The CTA stops here (a CTA without work). Peers must not need it afterwards.
"""

from __future__ import annotations

import numpy as np

from fusionc.errors import SimulationError
from fusionc.interp.numerics import round_to
from fusionc.ir.ops.tile_memory import K, param_of
from fusionc.ir.registry import (
    AFFINE,
    BOOL,
    FLOAT,
    INT,
    NONNEG_INT,
    POS_INT,
    Cost,
    OpDef,
    attr,
    enum,
    fail,
    register,
)
from fusionc.ir.types import FLOAT_DTYPES, DType
from fusionc.sim.state import CTAExit


def _infer_gemv(op):
    x, w = (v.type for v in op.operands)
    if w.rank < 2 or x.rank < 1 or x.dtype not in FLOAT_DTYPES or w.dtype not in FLOAT_DTYPES:
        fail(op, f"x {x}, w {w}",
             "x: [..., K] float tile, w: [N, K_total] (or [heads, N, K_total]) float parameter")
    if w.rank > 2 and not all(isinstance(d, int) for d in w.shape):
        fail(op, f"w {w} of rank {w.rank} with symbolic dims", "static dims past rank 2")
    k, rows = x.shape[-1], op.attr("rows")
    if isinstance(k, int) and isinstance(w.shape[-1], int) and k > w.shape[-1]:
        fail(op, f"tile of {k} columns wider than the weight {w}", f"K <= {w.shape[-1]}")
    return (x.with_shape(x.shape[:-1] + (rows,)).with_dtype(DType.f32),)


def _sim_gemv(op, args, cta):
    x = np.asarray(args[0], np.float32)
    name = op.operands[1].name
    arr = cta.memory.arrays[name]
    arr = arr.reshape(-1, arr.shape[-1])  # [heads, N, K] weights as [heads·N, K]
    r0, c0 = op.attr("row")(cta.cluster, cta.rank), op.attr("col")(cta.cluster, cta.rank)
    rows, k = op.attr("rows"), x.shape[-1]
    inside = r0 >= 0 and c0 >= 0 and r0 + rows <= arr.shape[0] and c0 + k <= arr.shape[1]
    if not inside and not op.attr("masked"):
        raise SimulationError(
            f"weight tile rows {r0}..{r0 + rows}, cols {c0}..{c0 + k} of CTA (cluster "
            f"{cta.cluster}, rank {cta.rank}) leaves %{name} of shape {list(arr.shape)}",
            op=op.name,
            loc=op.loc,
            valid="a tile inside the weight, or masked = true",
        )
    tile = np.zeros((rows, k), np.float32)
    rs, cs = (
        slice(max(r0, 0), min(r0 + rows, arr.shape[0])),
        slice(max(c0, 0), min(c0 + k, arr.shape[1])),
    )
    if rs.stop > rs.start and cs.stop > cs.start:
        tile[rs.start - r0 : rs.stop - r0, cs.start - c0 : cs.stop - c0] = cta.memory.read(
            name, (rs, cs), cta, op, flat=True
        )
    return (x @ tile.T,)


def _infer_reduce(op):
    x = op.operands[0].type
    axis = op.attr("axis")
    if not -x.rank <= axis < x.rank:
        fail(op, f"axis {axis} out of range for {x}", f"-{x.rank} <= axis < {x.rank}")
    axis %= x.rank
    return (x.with_shape(x.shape[:axis] + x.shape[axis + 1 :]).with_dtype(DType.f32),)


def _sim_reduce(op, args, cta):
    x = np.asarray(args[0], np.float32)
    axis, kind = op.attr("axis"), op.attr("op")
    out = {
        "sum": lambda: x.sum(axis),
        "max": lambda: x.max(axis),
        "sumsq": lambda: (x * x).sum(axis),
    }[kind]()
    return (round_to(out, DType.f32),)


def _infer_norm_apply(op):
    x, w, ss = (v.type for v in op.operands)
    if w.rank != 1 or x.rank < 1 or w.shape[0] != x.shape[-1] or ss.shape != x.shape[:-1]:
        fail(op, f"x {x}, w {w}, ss {ss}", "x: [..., K], w: [K], ss: f32[...]")
    if x.dtype not in FLOAT_DTYPES or ss.dtype != DType.f32:
        fail(op, f"x {x}, ss {ss}", "float x and f32 ss")
    if not 0 <= op.attr("eps") < float("inf"):
        fail(op, f"eps = {op.attr('eps')}", "a finite eps >= 0")
    return (x,)


def _sim_norm_apply(op, args, cta):
    x, w, ss = (np.asarray(a, np.float32) for a in args)
    r = 1.0 / np.sqrt(ss / np.float32(op.attr("dim")) + np.float32(op.attr("eps")))
    return (round_to(w * (x * r[..., None].astype(np.float32)), op.result.type.dtype),)


def _sim_when(op, args, cta):
    coord = cta.rank if op.attr("on") == "rank" else cta.cluster
    if op.attr("lo") <= coord < op.attr("hi"):
        from fusionc.sim.simulator import _run_ops

        yield from _run_ops(op.regions[0], cta)
    return ()


def _sim_exit(op, args, cta):
    raise CTAExit()


def _cost_gemv(op, env):
    """The weight tile read once for all rows; 2 FLOPs per weight element and row."""
    x, w = op.operands
    k, rows = x.type.shape[-1], op.attr("rows")
    batch = x.type.numel(env) // k
    return Cost(bytes_read=rows * k * w.type.dtype.itemsize, flops=2 * batch * rows * k)


register(
    OpDef(
        "gemv",
        __doc__,
        ("x", "w"),
        (
            attr("row", AFFINE, doc="first weight row of the tile"),
            attr("col", AFFINE, doc="first weight column (K offset)"),
            attr("rows", POS_INT, doc="rows of the tile (N)"),
            attr("masked", BOOL, False),
        ),
        _infer_gemv,
        where=K,
        simulate=_sim_gemv,
        verify=lambda op, g, m: param_of(op, g, op.operands[1], "weight"),
        cost=_cost_gemv,
    )
)
register(
    OpDef(
        "reduce",
        __doc__,
        ("x",),
        (attr("op", enum("sum", "max", "sumsq")), attr("axis", INT, -1)),
        _infer_reduce,
        where=K,
        simulate=_sim_reduce,
    )
)
register(
    OpDef(
        "norm_apply",
        __doc__,
        ("x", "w", "ss"),
        (attr("eps", FLOAT), attr("dim", POS_INT, doc="elements of the whole row")),
        _infer_norm_apply,
        where=K,
        simulate=_sim_norm_apply,
    )
)
register(
    OpDef(
        "when",
        __doc__,
        (),
        (attr("on", enum("rank", "cluster")), attr("lo", NONNEG_INT), attr("hi", NONNEG_INT)),
        lambda op: (),
        where=K,
        regions=1,
        simulate=_sim_when,
    )
)
register(OpDef("exit", __doc__, (), (), lambda op: (), where=K, simulate=_sim_exit))
