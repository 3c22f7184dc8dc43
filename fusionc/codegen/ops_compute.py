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


def mma_plan(x, w, plan: dict, mch: int, options, blocks: int = 1) -> dict | None:
    """The tensor-core gemv's choices (templates/lib/gemv_mma.cuh.j2), or None where it does
    not apply: x and w of one 16-bit dtype, 16-byte weight vectors, and at least
    ``options.gemv_mma_batch`` batch rows per weight read (0 turns tensor cores off).
    ``blocks``: CTAs per SM the kernel is built for (``EmitCtx.blocks``)."""
    on = options.gemv_mma_batch and mch >= options.gemv_mma_batch
    if not (on and plan["vec"] and w.dtype == x.dtype and w.itemsize == 2):
        return None
    pipe = options.gemv_mma_pipeline == 2 or (options.gemv_mma_pipeline == 1 and blocks == 1)
    # two blocks of k-steps in flight (registers for one CTA per SM), or one
    steps = max(1, (options.gemv_unroll or 16) // (4 if pipe else 2))  # 2 loads per k-step
    return dict(U=steps, NB=-(-min(mch, MAX_BATCH_REGS) // 8), pipe="true" if pipe else "false")


@emitter("gemv", check=check_gemv)
def emit_gemv(op, ctx) -> str:
    """CUDA of gemv: the weight tile streamed with 16-byte loads (when aligned), several in flight,
    fp32 accumulation for all batch rows; on tensor cores (``mma.sync``, weights as M, batch
    rows as N) from ``CodegenOptions.gemv_mma_batch`` rows on (templates/lib/gemv*.cuh.j2).
    """
    x, w, y = ctx.ref(op.operands[0]), ctx.ref(op.operands[1]), ctx.ref(op.result)
    lead = x.shape[:-1]
    mch = max(1, min(cnames.max_product(lead, ctx.max_batch), MAX_BATCH_REGS))
    plan = gemv_plan(op, x, w, ctx.options.gemv_unroll or auto_unroll(mch))
    mma = mma_plan(x, w, plan, mch, ctx.options, ctx.blocks)
    b = lambda v: "true" if v else "false"  # noqa: E731
    common = dict(
        x=x.ptr, M=cnames.product(lead), K=x.shape[-1], w=w.ptr, ldw=cnames.dim(w.shape[-1]),
        n_w=cnames.product(w.shape[:-1]), k_w=cnames.dim(w.shape[-1]),
        row=cnames.affine(op.attr("row")), col=cnames.affine(op.attr("col")),
        rows=op.attr("rows"), y=y.ptr, masked=b(op.attr("masked")), nc=b(w.readonly))
    if mma:
        ctx.need("gemv_mma")
        return ctx.render("ops/gemv_mma.cu.j2", **common, **mma)
    ctx.need("gemv")
    return ctx.render("ops/gemv.cu.j2", MCH=mch, **common,
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


def _norm_rows_bytes(op, kernel) -> int:
    """Scratch of norm_apply: one fp32 factor per row."""
    return 4 * max(1, cnames.max_product(op.operands[2].type.shape, kernel.attr("max_batch")))


@emitter("norm_apply", scratch=_norm_rows_bytes)
def emit_norm_apply(op, ctx) -> str:
    """CUDA of norm_apply: w · x · rsqrt(ss / dim + eps) in fp32, rounded to x's dtype; the
    per-row factor computed once per row."""
    x, w, ss = (ctx.ref(v) for v in op.operands)
    out = ctx.ref(op.result)
    return ctx.render(
        "ops/norm_apply.cu.j2", n=out.numel, K=cnames.dim(x.shape[-1]), ss=ss.ptr,
        rows=ss.numel, dim=cnames.f32_literal(op.attr("dim")),
        eps=cnames.f32_literal(op.attr("eps")), w=w.ptr, x=x.ptr, out=out.ptr, ot=out.ctype,
        scratch=ctx.scratch(op))
