"""Rotary position embedding (RoPE).

For head vector x at position p and pair i < rotary_dim/2, with
θ_i = theta^(−2i/rotary_dim) and angle a = p·θ_i computed in fp32:
    (x1', x2') = (x1·cos a − x2·sin a, x2·cos a + x1·sin a)
where the pair (x1, x2) is (x[i], x[i + rotary_dim/2]) for style ``neox`` (half split, as in
GPT-NeoX and Hugging Face Llama) or (x[2i], x[2i+1]) for style ``gptj`` (interleaved, as in GPT-J
and the original paper). Dimensions from rotary_dim to head_dim pass through unchanged.
Source: Su et al. 2021, "RoFormer", eq. 34.
"""
from __future__ import annotations

from fusionc.ir.ops.common import io_cost, numel
from fusionc.ir.registry import FLOAT, FLOAT_DTYPES_TEXT, POS_INT, OpDef, attr, enum, fail, register
from fusionc.ir.types import FLOAT_DTYPES, DType


def _infer(op):
    x, pos = (v.type for v in op.operands)
    if x.rank != 3 or x.dtype not in FLOAT_DTYPES:
        fail(op, f"x has type {x}", f"x: [B, heads, head_dim] of {FLOAT_DTYPES_TEXT}")
    if pos.dtype != DType.i32 or pos.shape != (x.shape[0],):
        fail(op, f"positions have type {pos}", f"i32[{x.shape[0]}]")
    r, d = op.attr("rotary_dim"), x.shape[2]
    if r % 2 or r > d:
        fail(op, f"rotary_dim = {r} with head_dim = {d}", f"an even rotary_dim <= {d}")
    if op.attr("theta") <= 0:
        fail(op, f"theta = {op.attr('theta')}", "theta > 0")
    return (x,)


register(OpDef(
    "rope", __doc__, ("x", "positions"),
    (attr("theta", FLOAT, doc="frequency base, e.g. 10000 or 500000"),
     attr("style", enum("neox", "gptj"), "neox", doc="pairing of dimensions"),
     attr("rotary_dim", POS_INT, doc="dims rotated, from the first")),
    _infer, cost=lambda op, env: io_cost(op, env, 6 * numel(op, env))))
