"""Linear layer (GEMV in decode, GEMM for many tokens).

y[..., n] = sum_k x[..., k] · w[n, k] (+ bias[n]), with weights stored [out, in] as in
``torch.nn.Linear``; products accumulated in fp32, the result rounded to the dtype of x, or to
``out_dtype`` when given (``out_dtype = f32``: the fp32 sums themselves, as an LM head's logits;
the ``out_dtype`` of ``torch.mm`` and Triton's ``tl.dot``).
"""
from __future__ import annotations

from fusionc.ir.ops.common import io_cost
from fusionc.ir.attrs import attr, enum
from fusionc.ir.registry import FLOAT_DTYPES_TEXT, OpDef, fail, register, same_dtype
from fusionc.ir.types import FLOAT_DTYPES, DType

OUT_DTYPE = attr("out_dtype", enum(*(d.value for d in FLOAT_DTYPES)), None, omit=True,
                 doc="the result's dtype (default: the dtype of x)")


def _infer(op):
    x, w = op.operands[0].type, op.operands[1].type
    types = [v.type for v in op.operands]
    same_dtype(op, *types)
    if x.dtype not in FLOAT_DTYPES:
        fail(op, f"x has dtype {x.dtype}", FLOAT_DTYPES_TEXT)
    if w.rank != 2 or x.rank < 1:
        fail(op, f"weight {w} is not a matrix [out, in]", "w: [out, in], x: [..., in]")
    if x.shape[-1] != w.shape[1]:
        fail(op, f"x {x} has {x.shape[-1]} input features but weight {w} expects {w.shape[1]}",
             f"x of shape [..., {w.shape[1]}] for weight [out, in] = {list(w.shape)}")
    if len(op.operands) == 3:
        b = op.operands[2].type
        if b.shape != (w.shape[0],):
            fail(op, f"bias {b} does not match weight rows {w.shape[0]}",
                 f"bias of shape [{w.shape[0]}]")
    y = x.with_shape(x.shape[:-1] + (w.shape[0],))
    out = dict(op.attrs).get("out_dtype")   # ops built without the registry have none
    return (y if out is None else y.with_dtype(DType(out)),)


def _run(op, args, ctx):
    """x @ w.T (+ bias) in ``ctx.acc`` (fp32 products and sums)."""
    x, w, *bias = (a.astype(ctx.acc) for a in args)
    y = x @ w.T
    return (y + bias[0] if bias else y,)


def _cost(op, env):
    out = op.results[0].type
    k = op.operands[0].type.shape[-1]
    return io_cost(op, env, 2 * out.numel(env) * k)


register(OpDef("linear", __doc__, ("x", "w", "bias?"), (OUT_DTYPE,), _infer, interpret=_run,
               cost=_cost))
