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

``scaling = [factor, low_freq_factor, high_freq_factor, original_max_position]`` rescales the
frequencies as Llama 3.1 does (Meta's ``apply_scaling`` in llama-models; Hugging Face
``rope_type = "llama3"``): with wavelength λ_i = 2π/θ_i, L = original_max_position,
λ_i < L/high_freq_factor keeps θ_i; λ_i > L/low_freq_factor gives θ_i/factor; in between,
s = (L/λ_i − low_freq_factor)/(high_freq_factor − low_freq_factor) and
θ_i' = (1 − s)·θ_i/factor + s·θ_i. The empty list (the default, not printed) means no scaling.
"""

from __future__ import annotations

import math

import numpy as np

from fusionc.ir.ops.common import io_cost, numel
from fusionc.ir.registry import (
    GRAPH_AND_KERNEL,
    FLOAT,
    FLOATS,
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
    sc = op.attr("scaling")
    if sc and (len(sc) != 4 or not all(0 < v < math.inf for v in sc) or sc[1] >= sc[2]):
        fail(op, f"scaling = {list(sc)}", "[] or [factor, low_freq_factor, high_freq_factor, "
             "original_max_position], all > 0, low_freq_factor < high_freq_factor")
    return (x,)


def inv_freq(theta: float, rotary_dim: int, scaling=()) -> np.ndarray:
    """θ_i = theta^(−2i/rotary_dim) for i < rotary_dim/2, float64, with Llama 3.1 frequency
    scaling when ``scaling`` is ``[factor, low_freq_factor, high_freq_factor, original_max]``
    (module docstring)."""
    freq = theta ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim)
    if not scaling:
        return freq
    factor, low, high, old_len = scaling
    wavelen = 2 * math.pi / freq
    smooth = np.clip((old_len / wavelen - low) / (high - low), 0.0, 1.0)
    return (1 - smooth) * freq / factor + smooth * freq


def pair_slices(style: str, rotary_dim: int) -> tuple[slice, slice]:
    """Index slices of the (x1, x2) halves of the rotated pairs along head_dim."""
    if style == "neox":
        return slice(0, rotary_dim // 2), slice(rotary_dim // 2, rotary_dim)
    return slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)


def rope_values(x: np.ndarray, pos: np.ndarray, op, acc) -> np.ndarray:
    """``x [B, ..., D]`` rotated at ``pos [B]`` by rope op ``op``'s attributes (theta, style,
    rotary_dim, scaling), all in ``acc`` (the interpreter's rule; also used by fused ops that
    rotate: ``attn_units``). RoFormer, Su et al. 2021, eq. 34."""
    r = op.attr("rotary_dim")
    x = x.astype(acc)
    freq = inv_freq(op.attr("theta"), r, op.attr("scaling")).astype(acc)  # [r/2]
    angle = np.asarray(pos).astype(acc)[:, None] * freq[None, :]  # [B, r/2]
    shape = (angle.shape[0],) + (1,) * (x.ndim - 2) + (r // 2,)
    cos, sin = np.cos(angle).reshape(shape), np.sin(angle).reshape(shape)
    i1, i2 = pair_slices(op.attr("style"), r)
    x1, x2 = x[..., i1], x[..., i2]
    y = x.copy()
    y[..., i1] = x1 * cos - x2 * sin
    y[..., i2] = x2 * cos + x1 * sin
    return y


def _run(op, args, ctx):
    return (rope_values(args[0], args[1], op, ctx.acc),)


register(
    OpDef(
        "rope",
        __doc__,
        ("x", "positions"),
        (
            attr("theta", FLOAT, doc="frequency base, e.g. 10000 or 500000"),
            attr("style", enum("neox", "gptj"), "neox", doc="pairing of dimensions"),
            attr("rotary_dim", POS_INT, doc="dims rotated, from the first"),
            attr("scaling", FLOATS, (), doc="Llama 3.1 frequency scaling [factor, "
                 "low_freq_factor, high_freq_factor, original_max_position]; [] = none"),
        ),
        _infer,
        interpret=_run,
        cost=lambda op, env: io_cost(op, env, 6 * numel(op, env)),
        where=GRAPH_AND_KERNEL,
    )
)
