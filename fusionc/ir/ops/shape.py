"""Shape ops: reshape (e.g. split the hidden vector into heads) and split along one axis.

They move no data on the GPU (views); the interpreter copies.
"""
from __future__ import annotations

from collections import Counter

from fusionc.ir.registry import DIMS, INT, INTS, OpDef, attr, fail, register


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


register(OpDef(
    "reshape", "y = x viewed with another shape of the same size (row-major).", ("x",),
    (attr("shape", DIMS, doc="new shape; sizes and symbols"),), _reshape))
register(OpDef(
    "split", "ys = consecutive slices of x along `axis` with the given sizes (e.g. q, k, v "
    "out of a fused QKV projection).", ("x",),
    (attr("axis", INT), attr("sizes", INTS)), _split))
