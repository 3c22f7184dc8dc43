"""Emitters of graph-IR ops allowed inside kernels, with their interpreter rules
(``fusionc/ir/ops/{elementwise,norm,rope,shape}.py``) as semantics: add, mul, silu, silu_mul,
cast, rms_norm, rope, reshape (a view: no code), split and concat (copies).
Arithmetic in fp32, each result rounded to its dtype as the interpreter does."""
from __future__ import annotations

import numpy as np

from fusionc.codegen import cnames
from fusionc.codegen.emitters import emitter
from fusionc.errors import CompileError
from fusionc.ir.ops.rope import inv_freq

_ELEMENTWISE = {
    "add": ("a + b", "a + b"),
    "mul": ("a * b", "a * b"),
    "silu": ("x / (1 + exp(-x))", "a / (1.0f + expf(-a))"),
    "silu_mul": ("silu(gate) * up", "(a / (1.0f + expf(-a))) * b"),
    "cast": ("x", "a"),
}


def _emit_elementwise(op, ctx) -> str:
    formula, expr = _ELEMENTWISE[op.name]
    out = ctx.ref(op.result)
    args = [(n, ctx.ref(v).ptr) for n, v in zip("ab", op.operands)]
    if op.name == "cast" and out.dtype == ctx.ref(op.operands[0]).dtype:
        expr = "a"
    return ctx.render("ops/elementwise.cu.j2", formula=formula, n=out.numel, args=args,
                      out=out.ptr, ot=out.ctype, expr=expr)


for _name in _ELEMENTWISE:
    emitter(_name)(_emit_elementwise)


def _norm_block(op, kernel) -> bool:
    """rms_norm with at most two rows per warp (decode batches): the whole CTA per row."""
    rows = cnames.max_product(op.operands[0].type.shape[:-1], kernel.attr("max_batch"))
    return rows <= 2 * (kernel.attr("threads") // 32)


@emitter("rms_norm", scratch=lambda op, k: 4 * (k.attr("threads") // 32) if _norm_block(op, k)
         else 0)
def emit_rms_norm(op, ctx) -> str:
    """CUDA of rms_norm on a tile (graph op reused in kernels): fp32 sum of squares per row,
    by the whole CTA per row for few rows, else by a warp per row."""
    x, w = (ctx.ref(v) for v in op.operands)
    out = ctx.ref(op.result)
    n = x.shape[-1]
    block = _norm_block(op, ctx.kernel)
    return ctx.render("ops/rms_norm.cu.j2", N=cnames.dim(n), Nf=f"(float){cnames.dim(n)}",
                      rows=cnames.product(x.shape[:-1]), x=x.ptr, xt=x.ctype, w=w.ptr,
                      out=out.ptr, ot=out.ctype, eps=cnames.f32_literal(op.attr("eps")),
                      block=block, scratch=ctx.scratch(op) if block else "")


@emitter("rope")
def emit_rope(op, ctx) -> str:
    """CUDA of rope on a tile: neox or gptj pairing, angles in fp32, dims past rotary_dim copied."""
    x, pos = (ctx.ref(v) for v in op.operands)
    out = ctx.ref(op.result)
    r = op.attr("rotary_dim")
    table = ctx.uid("fc_inv_freq")
    freq = inv_freq(op.attr("theta"), r, op.attr("scaling")).astype(np.float32)  # as interp
    vals = ", ".join(cnames.f32_literal(float(v)) for v in freq)
    ctx.decls.append(f"__device__ const float {table}[{r // 2}] = {{{vals}}};  // rope at {op.loc}")
    return ctx.render("ops/rope.cu.j2", style=op.attr("style"), R=r, D=x.shape[2],
                      heads=cnames.dim(x.shape[1]), n=out.numel, x=x.ptr, xt=x.ctype,
                      pos=pos.ptr, table=table, out=out.ptr, ot=out.ctype)


@emitter("reshape", view=True)
def emit_reshape(op, ctx) -> str:  # never called: views have no code
    """reshape is a view: no code, the result aliases the operand's shared memory."""
    return ""


def _pieces(op, ctx, whole, parts, split: bool) -> str:
    axis = op.attr("axis") % len(whole.shape)
    total = whole.shape[axis]
    if not isinstance(total, int) or not all(isinstance(p.shape[axis], int) for p in parts):
        raise CompileError(f"{op.name} along a symbolic axis", op=op.name, loc=op.loc,
                           valid="a static axis")
    pieces, start = [], 0
    for p in parts:
        pieces.append((p.ptr, p.shape[axis], start))
        start += p.shape[axis]
    return ctx.render("ops/slices.cu.j2", what=op.name, outer=cnames.product(whole.shape[:axis]),
                      inner=cnames.product(whole.shape[axis + 1:]), total=total, pieces=pieces,
                      whole=whole.ptr, split=split,
                      ct=(parts[0] if split else whole).ctype)


@emitter("split")
def emit_split(op, ctx) -> str:
    """CUDA of split: copies of consecutive slices along one axis."""
    return _pieces(op, ctx, ctx.ref(op.operands[0]), [ctx.ref(r) for r in op.results], True)


@emitter("concat")
def emit_concat(op, ctx) -> str:
    """CUDA of concat: copies of the operands side by side along one axis."""
    return _pieces(op, ctx, ctx.ref(op.result), [ctx.ref(v) for v in op.operands], False)
