"""Shape ops: reshape (e.g. split the hidden vector into heads) and split along one axis.

They move no data on the GPU (views); the interpreter copies.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from fusionc.ir.registry import GRAPH_AND_KERNEL, DIMS, INT, INTS, OpDef, attr, fail, register


def _static_and_symbols(shape):
    n, syms = 1, Counter()
    for d in shape:
        if isinstance(d, int):
            n *= d
        else:
            syms[d] += 1
    return n, syms


def _reshape(op):
    t = op.operands[0].type
    shape = op.attr("shape")
    if any(isinstance(d, int) and d < 1 for d in shape):
        fail(op, f"shape {list(shape)} has a size < 1", "positive sizes or symbols")
    if _static_and_symbols(shape) != _static_and_symbols(t.shape):
        fail(op, f"cannot reshape {t} to [{', '.join(map(str, shape))}]: element counts differ",
             "a shape with the same number of elements and the same symbolic dims, e.g. "
             "[B, heads, head_dim] with heads * head_dim equal to the features of x")
    return (t.with_shape(shape),)


def _split(op):
    t = op.operands[0].type
    axis, sizes = op.attr("axis"), op.attr("sizes")
    if not -t.rank <= axis < t.rank:
        fail(op, f"axis {axis} out of range for {t}", f"-{t.rank} <= axis < {t.rank}")
    axis %= t.rank
    if not sizes or any(s < 1 for s in sizes) or sum(sizes) != t.shape[axis]:
        fail(op, f"sizes {list(sizes)} do not add up to dim {axis} of {t}",
             f"positive sizes summing to {t.shape[axis]}")
    return tuple(t.with_shape(t.shape[:axis] + (s,) + t.shape[axis + 1:]) for s in sizes)


def _run_reshape(op, args, ctx):
    return (args[0].reshape(ctx.shape(op.results[0])),)


def _run_split(op, args, ctx):
    x, axis = args[0], op.attr("axis") % args[0].ndim
    cuts = np.cumsum(op.attr("sizes"))[:-1]
    return tuple(np.split(x, cuts, axis=axis))


register(OpDef(
    "reshape", "y = x viewed with another shape of the same size (row-major).", ("x",),
    (attr("shape", DIMS, doc="new shape; sizes and symbols"),), _reshape,
    interpret=_run_reshape, where=GRAPH_AND_KERNEL))
register(OpDef(
    "split", "ys = consecutive slices of x along `axis` with the given sizes (e.g. q, k, v "
    "out of a fused QKV projection).", ("x",),
    (attr("axis", INT), attr("sizes", INTS)), _split, interpret=_run_split, where=GRAPH_AND_KERNEL))


def _concat(op):
    ts = [v.type for v in op.operands]
    t, axis = ts[0], op.attr("axis")
    if not -t.rank <= axis < t.rank:
        fail(op, f"axis {axis} out of range for {t}", f"-{t.rank} <= axis < {t.rank}")
    axis %= t.rank
    for u in ts[1:]:
        if u.dtype != t.dtype or u.rank != t.rank or \
                any(a != b for i, (a, b) in enumerate(zip(u.shape, t.shape)) if i != axis):
            fail(op, f"operands {', '.join(map(str, ts))} differ off axis {axis}",
                 "one dtype, equal sizes on every other axis")
    if not all(isinstance(u.shape[axis], int) for u in ts):
        fail(op, "concatenation along a symbolic axis", "static sizes along the axis")
    return (t.with_shape(t.shape[:axis] + (sum(u.shape[axis] for u in ts),) +
                         t.shape[axis + 1:]),)


register(OpDef(
    "concat", "y = the operands joined along `axis`, in order (packs q, k, v partials for one "
    "collective).", ("x", "xs*"), (attr("axis", INT, -1),), _concat,
    interpret=lambda op, args, ctx: (np.concatenate(args, axis=op.attr("axis")),),
    where=GRAPH_AND_KERNEL))
