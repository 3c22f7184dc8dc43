"""Rotary position embedding (RoPE).

For head vector x at position p and pair i < rotary_dim/2, with
θ_i = theta^(−2i/rotary_dim) and angle a = p·θ_i computed in fp32 (θ_i evaluated in float64 and
rounded to fp32 — a compile-time constant —, then one fp32 multiply by p, then fp32 cos/sin;
at p ~ 1e5 the fp32 angle differs from the exact one by up to ~4e-3 rad, as on the GPU):
    (x1', x2') = (x1·cos a − x2·sin a, x2·cos a + x1·sin a)
where the pair (x1, x2) is (x[i], x[i + rotary_dim/2]) for style ``neox`` (half split, as in
GPT-NeoX and Hugging Face Llama) or (x[2i], x[2i+1]) for style ``gptj`` (interleaved, as in GPT-J
and the original paper). Dimensions from rotary_dim to head_dim pass through unchanged.
Source: Su et al. 2021, "RoFormer", eq. 34. The float64 reference (``precise``) computes
θ_i and the angle in float64.
"""

from __future__ import annotations

import math

import numpy as np

from fusionc.ir.ops.common import io_cost, numel
from fusionc.ir.registry import (
    GRAPH_AND_KERNEL,
    FLOAT,
    FLOAT_DTYPES_TEXT,
    POS_INT,
    OpDef,
    attr,
    enum,
    fail,
    register,
)
from fusionc.ir.types import FLOAT_DTYPES, DType


def _infer(op):
    x, pos = (v.type for v in op.operands)
    if x.rank != 3 or x.dtype not in FLOAT_DTYPES:
        fail(op, f"x has type {x}", f"x: [B, heads, head_dim] of {FLOAT_DTYPES_TEXT}")
    if pos.dtype != DType.i32 or pos.shape != (x.shape[0],):
        fail(op, f"positions have type {pos}", f"i32[{x.shape[0]}]")
    r, d = op.attr("rotary_dim"), x.shape[2]
    if not isinstance(d, int) or r % 2 or r > d:
        fail(
            op,
            f"rotary_dim = {r} with head_dim = {d}",
            f"an even rotary_dim <= {d}" if isinstance(d, int) else "a static head_dim",
        )
    if not 0 < op.attr("theta") < math.inf:
        fail(op, f"theta = {op.attr('theta')}", "a finite theta > 0")
    return (x,)


def pair_slices(style: str, rotary_dim: int) -> tuple[slice, slice]:
    """Index slices of the (x1, x2) halves of the rotated pairs along head_dim."""
    if style == "neox":
        return slice(0, rotary_dim // 2), slice(rotary_dim // 2, rotary_dim)
    return slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)


def _run(op, args, ctx):
    r, theta = op.attr("rotary_dim"), op.attr("theta")
    x, pos = args[0].astype(ctx.acc), args[1]
    inv_freq = (theta ** (-2.0 * np.arange(r // 2) / r)).astype(ctx.acc)  # [r/2]
    angle = pos.astype(ctx.acc)[:, None] * inv_freq[None, :]  # [B, r/2]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]  # [B, 1, r/2]
    i1, i2 = pair_slices(op.attr("style"), r)
    x1, x2 = x[..., i1], x[..., i2]
    y = x.copy()
    y[..., i1] = x1 * cos - x2 * sin
    y[..., i2] = x2 * cos + x1 * sin
    return (y,)


register(
    OpDef(
        "rope",
        __doc__,
        ("x", "positions"),
        (
            attr("theta", FLOAT, doc="frequency base, e.g. 10000 or 500000"),
            attr("style", enum("neox", "gptj"), "neox", doc="pairing of dimensions"),
            attr("rotary_dim", POS_INT, doc="dims rotated, from the first"),
        ),
        _infer,
        interpret=_run,
        cost=lambda op, env: io_cost(op, env, 6 * numel(op, env)),
        where=GRAPH_AND_KERNEL,
    )
)
