"""Tensor-parallel communication: all_reduce.

y = Σ_r x_r over the ``group`` ranks of a tensor-parallel group; every rank receives the sum
(accumulated in fp32, rounded to the dtype of x). Groups are consecutive ranks
``[group·k, group·k + group)``; the interpreter sums in rank order.
"""
from __future__ import annotations

from fusionc.ir.ops.common import io_cost
from fusionc.ir.registry import FLOAT_DTYPES_TEXT, POS_INT, OpDef, attr, fail, register
from fusionc.ir.types import FLOAT_DTYPES


def _infer(op):
    t = op.operands[0].type
    if t.dtype not in FLOAT_DTYPES:
        fail(op, f"x has dtype {t.dtype}", FLOAT_DTYPES_TEXT)
    return (t,)


def _run(op, args, ctx):
    """Sum over the ranks of the group, in rank order, in ``ctx.acc``."""
    xs = ctx.group_values(op.operands[0], op.attr("group"), op)
    total = xs[0].astype(ctx.acc)
    for x in xs[1:]:
        total = total + x.astype(ctx.acc)
    return (total,)


register(OpDef("all_reduce", __doc__, ("x",),
               (attr("group", POS_INT, doc="number of ranks in the tensor-parallel group"),),
               _infer, interpret=_run, cost=io_cost))
