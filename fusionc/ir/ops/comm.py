"""Tensor-parallel communication: all_reduce.

y = Σ_r x_r over the ``group`` ranks of a tensor-parallel group; every rank receives the sum
(accumulated in fp32, rounded to the dtype of x).
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


register(OpDef("all_reduce", __doc__, ("x",),
               (attr("group", POS_INT, doc="number of ranks in the tensor-parallel group"),),
               _infer, cost=io_cost))
