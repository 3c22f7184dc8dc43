"""Emitters of the in-CTA compute ops: gemv, reduce, norm_apply."""
from __future__ import annotations

from fusionc.codegen import cnames
from fusionc.codegen.emitters import emitter
from fusionc.errors import CompileError

MAX_BATCH_REGS = 16  # batch rows accumulated in registers per weight read


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def gemv_plan(op, x, w, unroll: int) -> dict:
    """Compile-time choices of one gemv: vector width, lanes per row, batch chunk."""
    k = x.shape[-1]
    kt = w.shape[-1]
    v = 16 // w.itemsize
    vec = (isinstance(kt, int) and (kt * w.itemsize) % 16 == 0 and k % v == 0
           and cnames.affine_aligned(op.attr("col"), v))
    v = v if vec else 1
    per_row = -(-k // v)
    lpr = min(32, _pow2_at_least(-(-per_row // unroll)))
    return dict(V=v, vec=vec, LPR=lpr, U=unroll,
                path="16-byte weight vectors" if vec else "scalar weight loads (alignment)")


def auto_unroll(rows_in_registers: int) -> int:
    """Weight loads in flight per thread: as many as registers allow next to the accumulators
    of the batch rows (16 loads of 16 bytes up to 4 rows, 8 up to 8, else 4)."""
    return 16 if rows_in_registers <= 4 else 8 if rows_in_registers <= 8 else 4


def check_gemv(op, kernel) -> None:
    """CompileError before codegen for a gemv over a symbolic K."""
    k = op.operands[0].type.shape[-1]
    if not isinstance(k, int):
        raise CompileError(f"gemv over a symbolic K ({k})", op=op.name, loc=op.loc,
                           valid="a static last dim of x")


@emitter("gemv", check=check_gemv)
def emit_gemv(op, ctx) -> str:
    """CUDA of gemv: the weight tile streamed with 16-byte loads (when aligned), several in flight,
    fp32 accumulation for all batch rows (templates/lib/gemv.cuh.j2).
    """
    x, w, y = ctx.ref(op.operands[0]), ctx.ref(op.operands[1]), ctx.ref(op.result)
    ctx.need("gemv")
    lead = x.shape[:-1]
    mch = max(1, min(cnames.max_product(lead, ctx.max_batch), MAX_BATCH_REGS))
    plan = gemv_plan(op, x, w, ctx.options.gemv_unroll or auto_unroll(mch))
    b = lambda v: "true" if v else "false"  # noqa: E731
    return ctx.render(
        "ops/gemv.cu.j2", x=x.ptr, M=cnames.product(lead), K=x.shape[-1], w=w.ptr,
        ldw=cnames.dim(w.shape[-1]), n_w=cnames.product(w.shape[:-1]),
        k_w=cnames.dim(w.shape[-1]),
        row=cnames.affine(op.attr("row")), col=cnames.affine(op.attr("col")),
        rows=op.attr("rows"), y=y.ptr, MCH=mch, masked=b(op.attr("masked")), nc=b(w.readonly),
        **{k: (b(v) if isinstance(v, bool) else v) for k, v in plan.items()})


@emitter("reduce")
def emit_reduce(op, ctx) -> str:
    """CUDA of reduce (sum, max, sumsq over one axis) as a block reduction in fp32."""
    x, out = ctx.ref(op.operands[0]), ctx.ref(op.result)
    axis = op.attr("axis") % len(x.shape)
    kind = op.attr("op")
    length = x.shape[axis]
    warp = not isinstance(length, int) or length > 32
    step = {"sum": "acc + v", "max": "fc_max(acc, v)", "sumsq": "acc + v * v"}[kind]
    return ctx.render(
        "ops/reduce.cu.j2", kind=kind, L=cnames.dim(length), outer=cnames.product(x.shape[:axis]),
        inner=cnames.product(x.shape[axis + 1:]), warp=warp, x=x.ptr, xt=x.ctype, out=out.ptr,
        init="-FC_INF" if kind == "max" else "0.f", step=step)


@emitter("norm_apply")
def emit_norm_apply(op, ctx) -> str:
    """CUDA of norm_apply: w · x · rsqrt(ss / dim + eps) in fp32, rounded to x's dtype."""
    x, w, ss = (ctx.ref(v) for v in op.operands)
    out = ctx.ref(op.result)
    return ctx.render(
        "ops/norm_apply.cu.j2", n=out.numel, K=cnames.dim(x.shape[-1]), ss=ss.ptr,
        dim=cnames.f32_literal(op.attr("dim")), eps=cnames.f32_literal(op.attr("eps")),
        w=w.ptr, x=x.ptr, out=out.ptr, ot=out.ctype)
