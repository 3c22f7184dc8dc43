"""Emitters of the MLA tile ops ``mla_attn_unit`` (templates/ops/mla_attn_unit.cu.j2,
lib/mla.cuh.j2) and ``attn_merge`` (templates/ops/attn_merge.cu.j2).

The latent cache streams with 16-byte ``cp.async`` copies, so a row must be whole 16-byte
vectors (W · itemsize % 16 == 0: 576 in bf16/f16, any multiple of 4 in f32)."""
from __future__ import annotations

from fusionc.codegen import cnames
from fusionc.codegen.emitters import emitter
from fusionc.errors import CompileError

STAGE_BUDGET = 80 * 1024  # bytes of staged cache rows (two stages) per CTA
MAX_HEADS = 16            # heads per CTA: output accumulators live in registers


def mla_tile(op, threads: int) -> int:
    """Rows per staged tile: the largest of 32, 16, 8 whose two stages fit the budget and that
    leaves a power-of-two number (≤ 32) of threads per token for the score step."""
    w = op.operands[1].type.shape[2]
    isz = op.operands[1].type.dtype.itemsize
    for tt in (32, 16, 8):
        seg = threads // tt
        if 2 * tt * (w * isz + 16) <= STAGE_BUDGET and threads % tt == 0 and seg <= 32 \
                and seg & (seg - 1) == 0:
            return tt
    return 0


def mla_scratch(op, kernel) -> int:
    """Bytes of shared memory mla_attn_unit uses: the larger of the CUDA-core layout
    (FcMlaSmem) and the tensor-core one (FcMlaMmaSmem) in lib/mla, whichever the code takes."""
    g, w = op.operands[0].type.shape[1:]
    isz = op.operands[1].type.dtype.itemsize
    tt = mla_tile(op, kernel.attr("threads"))
    fma = 2 * tt * (w + 16 // isz) * isz + (g * w + g * tt + 3 * g) * 4
    mma = 2 * tt * (w + 8) * 2 + 16 * (w + 8) * 2 + (8 // (tt // 8)) * 16 * tt * 4 \
        + 16 * (tt + 8) * 2 + 3 * 16 * 4
    return max(fma, mma)


def check_mla(op, kernel) -> None:
    """CompileError before codegen: symbolic heads or cache sizes, rows that are not whole
    16-byte vectors, more heads per CTA than :data:`MAX_HEADS`, a dtype other than f16, bf16,
    f32, or a CTA size that is not a multiple of 32 threads of at least 64."""
    q, cache = op.operands[0].type, op.operands[1].type
    g, w = q.shape[1:]
    isz = cache.dtype.itemsize
    if not all(isinstance(d, int) for d in (g, w, cache.shape[1])):
        raise CompileError(f"q {q}, cache {cache}: symbolic heads, width or cache length",
                           op=op.name, loc=op.loc, valid="static heads, max_seq and row width")
    if (w * isz) % 16 or w % 4:
        raise CompileError(f"cache rows of {w} {cache.dtype} elements ({w * isz} bytes) are "
                           "not whole 16-byte vectors", op=op.name, loc=op.loc,
                           valid=f"latent + rope a multiple of {max(4, 16 // isz)}")
    if g > MAX_HEADS:
        raise CompileError(f"{g} heads: every work unit computes all heads in one CTA",
                           op=op.name, loc=op.loc,
                           valid=f"at most {MAX_HEADS} heads (the output accumulators live in "
                                 "registers)")
    if 2 * 16 * (w * isz + 16) > STAGE_BUDGET:
        raise CompileError(f"cache rows of {w} {cache.dtype} elements: two stages of 16 rows "
                           f"need {2 * 16 * (w * isz + 16)} bytes", op=op.name, loc=op.loc,
                           valid=f"rows of at most {(STAGE_BUDGET // 32 - 16) // isz} elements "
                                 f"(a {STAGE_BUDGET // 1024} KB staging buffer)")
    t = kernel.attr("threads")
    if t % 32 or t < 64 or not mla_tile(op, t):
        raise CompileError(f"{t} threads per CTA", op=op.name, loc=op.loc,
                           valid="a multiple of 32 of at least 64 that splits into a power of "
                                 "two threads per cached token (e.g. 128, 256, 512)")
    if {q.dtype.value, cache.dtype.value} - {"f16", "bf16", "f32"}:
        raise CompileError(f"q {q.dtype}, cache {cache.dtype}", op=op.name, loc=op.loc,
                           valid="f16, bf16 or f32")


@emitter("mla_attn_unit", scratch=mla_scratch, check=check_mla)
def emit_mla_unit(op, ctx) -> str:
    """CUDA of mla_attn_unit: the work unit's row and part from the run-time batch, then the
    split-KV loop over that row (tensor cores for 16-bit caches; q read from global memory)."""
    q, cache, lens, pos, new = (ctx.ref(v) for v in op.operands)
    m, l, o = (ctx.ref(r) for r in op.results)
    ctx.need("attention")
    ctx.need("mla")
    return ctx.render(
        "ops/mla_attn_unit.cu.j2", G=q.shape[1], W=q.shape[2], L=op.attr("latent"),
        TT=mla_tile(op, ctx.kernel.attr("threads")), tc=cache.ctype, units=op.attr("units"),
        scratch_bytes=mla_scratch(op, ctx.kernel), q=q.ptr, cache=cache.ptr, S=cache.shape[1],
        lens=lens.ptr, pos=pos.ptr, new=new.ptr, B=cnames.dim(lens.shape[0]),
        unit=cnames.affine(op.attr("unit")), tile=op.attr("tile"),
        scale=cnames.f32_literal(op.attr("scale")), m=m.ptr, l=l.ptr, o=o.ptr,
        scratch=ctx.scratch(op))


def merge_scratch(op, kernel) -> int:
    """Bytes of attn_merge's scratch: max and denominator per (row, head), weight per (unit,
    head)."""
    u, g = op.operands[0].type.shape
    b = op.operands[3].type.shape[0]
    b = b if isinstance(b, int) else kernel.attr("max_batch")
    return (2 * b * g + u * g) * 4


@emitter("attn_merge", scratch=merge_scratch)
def emit_attn_merge(op, ctx) -> str:
    """CUDA of attn_merge: per (row, head, column) the weighted sum of its units' partials."""
    m, l, o, lens = (ctx.ref(v) for v in op.operands)
    out = ctx.ref(op.result)
    b = lens.shape[0]
    return ctx.render("ops/attn_merge.cu.j2", U=m.shape[0], G=m.shape[1], D=o.shape[2],
                      B=cnames.dim(b), MB=b if isinstance(b, int) else ctx.max_batch,
                      n=out.numel, m=m.ptr, l=l.ptr, o=o.ptr, out=out.ptr,
                      scratch=ctx.scratch(op))
