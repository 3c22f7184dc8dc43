"""Elementwise ops: add, mul, silu, silu_mul (SwiGLU) and cast.

All take operands of one shape and one dtype (no broadcasting, no implicit casts) and compute in
fp32, rounding the result to the operand dtype.
"""

from __future__ import annotations

import numpy as np

from fusionc.ir.ops.common import io_cost, numel
from fusionc.ir.registry import (
    GRAPH_AND_KERNEL,
    DTYPE,
    FLOAT_DTYPES_TEXT,
    OpDef,
    attr,
    fail,
    register,
    same_dtype,
)
from fusionc.ir.types import FLOAT_DTYPES, DType


ELEMENTWISE = frozenset({"elementwise"})   # commutes with views (fusionc.passes.fold_views)


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


def _f(ctx, *args):
    """Operands converted to the arithmetic dtype (fp32, or fp64 for the reference)."""
    return [a.astype(ctx.acc) for a in args]


def _silu(x):
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-x))


def _run_add(op, args, ctx):
    a, b = _f(ctx, *args)
    return (a + b,)


def _run_mul(op, args, ctx):
    a, b = _f(ctx, *args)
    return (a * b,)


def _run_silu(op, args, ctx):
    return (_silu(*_f(ctx, *args)),)


def _run_silu_mul(op, args, ctx):
    g, u = _f(ctx, *args)
    return (_silu(g) * u,)


def _unary(op):
    t = op.operands[0].type
    _float(op, t)
    return (t,)


register(
    OpDef(
        "add",
        "y = a + b, elementwise (residual connections).",
        ("a", "b"),
        (),
        _same_type,
        interpret=_run_add,
        cost=lambda op, env: io_cost(op, env, numel(op, env)),
        where=GRAPH_AND_KERNEL,
        traits=ELEMENTWISE,
    )
)
register(
    OpDef(
        "mul",
        "y = a * b, elementwise.",
        ("a", "b"),
        (),
        _same_type,
        interpret=_run_mul,
        cost=lambda op, env: io_cost(op, env, numel(op, env)),
        where=GRAPH_AND_KERNEL,
        traits=ELEMENTWISE,
    )
)
register(
    OpDef(
        "silu",
        "y = x * sigmoid(x) (Hendrycks & Gimpel 2016, 'GELUs', SiLU).",
        ("x",),
        (),
        _unary,
        interpret=_run_silu,
        cost=lambda op, env: io_cost(op, env, 4 * numel(op, env)),
        where=GRAPH_AND_KERNEL,
        traits=ELEMENTWISE,
    )
)
register(
    OpDef(
        "silu_mul",
        "y = silu(gate) * up: the SwiGLU gate of Llama MLPs (Shazeer 2020, "
        "'GLU Variants Improve Transformer', eq. 6).",
        ("gate", "up"),
        (),
        _same_type,
        interpret=_run_silu_mul,
        cost=lambda op, env: io_cost(op, env, 5 * numel(op, env)),
        where=GRAPH_AND_KERNEL,
        traits=ELEMENTWISE,
    )
)


def _cast(op):
    t = op.operands[0].type
    return (t.with_dtype(DType(op.attr("dtype"))),)


register(
    OpDef(
        "cast",
        "y = x converted to `dtype` (round to nearest even).",
        ("x",),
        (attr("dtype", DTYPE, doc="target element type"),),
        _cast,
        interpret=lambda op, args, ctx: (args[0],),
        cost=io_cost,
        where=GRAPH_AND_KERNEL,
        traits=ELEMENTWISE,
    )
)
