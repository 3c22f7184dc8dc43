"""RMSNorm.

y = w · x · rsqrt(mean(x², last axis) + eps), with the sum of squares accumulated in fp32 and the
result rounded to the dtype of x (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization",
eq. 4; eps inside the square root as in Llama). Applied over the last axis, so it serves both the
hidden-state norm (x: [B, hidden]) and per-head QK-norm (x: [B, heads, head_dim], w: [head_dim]).
"""

from __future__ import annotations

import math

import numpy as np

from fusionc.ir.ops.common import io_cost, numel
from fusionc.ir.registry import (
    GRAPH_AND_KERNEL,
    FLOAT,
    FLOAT_DTYPES_TEXT,
    OpDef,
    attr,
    fail,
    register,
    same_dtype,
)
from fusionc.ir.types import FLOAT_DTYPES


def _infer(op):
    x, w = (v.type for v in op.operands)
    same_dtype(op, x, w)
    if x.dtype not in FLOAT_DTYPES:
        fail(op, f"x has dtype {x.dtype}", FLOAT_DTYPES_TEXT)
    if x.rank < 1 or w.rank != 1 or w.shape[0] != x.shape[-1]:
        fail(
            op,
            f"weight {w} does not match the last axis of x {x}",
            f"weight of shape [{x.shape[-1] if x.rank else 'D'}]",
        )
    if not 0 <= op.attr("eps") < math.inf:
        fail(op, f"eps = {op.attr('eps')}", "a finite eps >= 0")
    return (x,)


def rms_norm_values(x: np.ndarray, w: np.ndarray, eps: float, acc) -> np.ndarray:
    """y = (x · r) · w with r = 1 / sqrt(mean(x²) + eps) over the last axis, all in ``acc``
    (the interpreter's rule; also used by fused ops that end in an RMSNorm)."""
    x, w = x.astype(acc), w.astype(acc)
    ms = np.mean(x * x, axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        r = 1 / np.sqrt(ms + np.dtype(acc).type(eps))
    return (x * r) * w


def _run(op, args, ctx):
    """:func:`rms_norm_values` in ``ctx.acc``."""
    return (rms_norm_values(args[0], args[1], op.attr("eps"), ctx.acc),)


register(
    OpDef(
        "rms_norm",
        __doc__,
        ("x", "weight"),
        (attr("eps", FLOAT, doc="added to mean(x^2) inside the square root"),),
        _infer,
        interpret=_run,
        cost=lambda op, env: io_cost(op, env, 4 * numel(op, env)),
        where=GRAPH_AND_KERNEL,
    )
)
