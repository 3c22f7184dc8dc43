"""Elementwise ops: add, mul, silu, silu_mul (SwiGLU) and cast.

All take operands of one shape and one dtype (no broadcasting, no implicit casts) and compute in
fp32, rounding the result to the operand dtype.
"""
from __future__ import annotations

from fusionc.ir.ops.common import io_cost, numel
from fusionc.ir.registry import DTYPE, FLOAT_DTYPES_TEXT, OpDef, attr, fail, register, same_dtype
from fusionc.ir.types import FLOAT_DTYPES, DType


def _same_type(op):
    a, b = (v.type for v in op.operands)
    same_dtype(op, a, b)
    if a.shape != b.shape:
        fail(op, f"operand shapes differ: {a} and {b}", "operands of one shape")
    _float(op, a)
    return (a,)


def _float(op, t):
    if t.dtype not in FLOAT_DTYPES:
        fail(op, f"operand has dtype {t.dtype}", FLOAT_DTYPES_TEXT)


def _unary(op):
    t = op.operands[0].type
    _float(op, t)
    return (t,)


register(OpDef(
    "add", "y = a + b, elementwise (residual connections).", ("a", "b"), (), _same_type,
    cost=lambda op, env: io_cost(op, env, numel(op, env))))
register(OpDef(
    "mul", "y = a * b, elementwise.", ("a", "b"), (), _same_type,
    cost=lambda op, env: io_cost(op, env, numel(op, env))))
register(OpDef(
    "silu", "y = x * sigmoid(x) (Hendrycks & Gimpel 2016, 'GELUs', SiLU).", ("x",), (), _unary,
    cost=lambda op, env: io_cost(op, env, 4 * numel(op, env))))
register(OpDef(
    "silu_mul", "y = silu(gate) * up: the SwiGLU gate of Llama MLPs (Shazeer 2020, "
    "'GLU Variants Improve Transformer', eq. 6).", ("gate", "up"), (), _same_type,
    cost=lambda op, env: io_cost(op, env, 5 * numel(op, env))))


def _cast(op):
    t = op.operands[0].type
    return (t.with_dtype(DType(op.attr("dtype"))),)


register(OpDef(
    "cast", "y = x converted to `dtype` (round to nearest even).", ("x",),
    (attr("dtype", DTYPE, doc="target element type"),), _cast, cost=io_cost))
