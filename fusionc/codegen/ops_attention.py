"""Emitters of the attention tile ops: attn_partial, attn_rescale, attn_finish, kv_append.

attn_partial streams K and V rows with 16-byte ``cp.async`` copies, so a cache row must be a
whole number of 16-byte vectors: head_dim x itemsize % 16 == 0 (head_dim 64, 72, 80, 96, 128,
256 in f16/bf16 and multiples of 4 in f32); other head dims are rejected before NVRTC.
"""
from __future__ import annotations

from fusionc.codegen import cnames
from fusionc.codegen.emitters import emitter
from fusionc.errors import CompileError

STAGE_BUDGET = 64 * 1024  # bytes of K/V staging (two stages of K and V) per CTA


def attn_tile(op) -> int:
    """Tokens per staged tile: the largest of 64, 32, 16, 8 whose staging fits the budget."""
    d = op.operands[0].type.shape[2]
    isz = op.operands[1].type.dtype.itemsize
    for tt in (64, 32, 16, 8):
        if 4 * tt * (d * isz + 16) <= STAGE_BUDGET:
            return tt
    return 8


STREAM_MAX_REGS = 32  # G x (16-byte vector elements): q and o each hold that many floats


def streamed(op, threads: int) -> bool:
    """Whether attn_partial takes the streamed path (FcAttnStream in lib/attention): a 16-byte
    vector per lane splits head_dim over a power of two of at most 32 lanes, and q and the
    outputs of the G query heads take at most 2 x 32 registers per lane (G <= 4 for 16-bit
    caches, G <= 8 for f32): with more, a 256-thread CTA at two CTAs per SM (128 registers)
    spills."""
    g = op.operands[0].type.shape[1]
    ve, lanes = 16 // op.operands[1].type.dtype.itemsize, _lanes(op)
    return 0 < lanes <= 32 and lanes & (lanes - 1) == 0 and g * ve <= STREAM_MAX_REGS \
        and threads % lanes == 0


def _lanes(op) -> int:
    """Lanes per token in the streamed path: head_dim in 16-byte vectors (0 if not whole)."""
    d, isz = op.operands[0].type.shape[2], op.operands[1].type.dtype.itemsize
    return d * isz // 16 if (d * isz) % 16 == 0 else 0


def stream_tokens(g: int, blocks: int, threads: int) -> int:
    """Tokens (K and V loads) per block of a lane group in the streamed path: 8 where a thread
    may hold 255 registers (one CTA per SM, ``blocks`` = 1, of at most 256 threads), else 4
    (2 from 7 query heads per KV head: f32 caches stream up to G = 8), which keeps a 256-thread
    CTA within ``__launch_bounds__``' 128 registers (two CTAs per SM). Measured on an H200
    (2026-11-30, Llama-3-8B attention, G = 4): at one CTA per SM (batch 16, 180 KB of shared
    memory) 8 tokens against 2 took 172 / 342 / 1021 µs against 192 / 429 / 1365 at KV 1024 /
    4096 / 16384; at two CTAs per SM 4 tokens against 2 took 82 against 88 µs (batch 1, KV
    16384), 231 against 256 (batch 4) and 787 against 899 (batch 16); 8 tokens spill there."""
    if blocks == 1 and threads <= 256:
        return 8
    return 2 if g >= 7 else 4


def stream_pipelined(g: int, option: int) -> bool:
    """Whether the streamed path prefetches the next block (``attn_stream`` = 2) — below 4
    query heads per KV head only: with 4 the prefetch registers cost more than it hides
    (measured on an H200, 2026-11-30: Llama-3-8B at KV 16384, 107 µs against 86 at batch 1)."""
    return option >= 2 and g < 4


def attn_scratch(op, kernel) -> int:
    """Bytes of shared memory attn_partial uses (mirrors FcAttnStream / FcAttnSmem in
    lib/attention). Both paths are sized; the larger is reserved, so that the layout does not
    depend on the codegen options."""
    g, d = op.operands[0].type.shape[1:]
    threads = kernel.attr("threads")
    stream = (threads // _lanes(op)) * g * (d + 2) * 4 if streamed(op, threads) else 0
    return max(stream, _staged_scratch(op))


def _staged_scratch(op) -> int:
    g, d = op.operands[0].type.shape[1:]
    isz = op.operands[1].type.dtype.itemsize
    tt = attn_tile(op)
    dp = d + 16 // isz
    return 2 * (2 * tt * dp * isz) + (g * tt + 3 * g) * 4


def check_partial(op, kernel) -> None:
    """CompileError before codegen if the attention tile op cannot run: symbolic head counts or
    cache sizes, K/V rows that are not whole 16-byte vectors, more query heads per KV head than
    threads, or a dtype other than f16, bf16, f32.
    """
    q, kc = op.operands[0].type, op.operands[1].type
    b, g, d = q.shape
    isz = kc.dtype.itemsize
    if not (isinstance(g, int) and isinstance(d, int)) or not all(
            isinstance(n, int) for n in kc.shape[1:]):
        raise CompileError(f"q {q}, cache {kc}: symbolic heads, head_dim or cache length",
                           op=op.name, loc=op.loc, valid="static G, head_dim, max_seq, kv_heads")
    if (d * isz) % 16:
        raise CompileError(
            f"head_dim {d} of a {kc.dtype} cache is {d * isz} bytes per row, not a multiple of "
            "the 16-byte vector width of the K/V stream", op=op.name, loc=op.loc,
            valid=f"head_dim a multiple of {16 // isz} for {kc.dtype}")
    if g > kernel.attr("threads"):
        raise CompileError(f"{g} query heads per KV head with {kernel.attr('threads')} threads",
                           op=op.name, loc=op.loc, valid="at most one query head per thread")
    if q.dtype.value not in ("f16", "bf16", "f32") or kc.dtype.value not in ("f16", "bf16",
                                                                             "f32"):
        raise CompileError(f"q {q.dtype}, cache {kc.dtype}", op=op.name, loc=op.loc,
                           valid="f16, bf16 or f32")


@emitter("attn_partial", scratch=attn_scratch, check=check_partial)
def emit_attn_partial(op, ctx) -> str:
    """CUDA of attn_partial: split-KV online softmax over this CTA's chunk
    (templates/ops/attn_partial.cu.j2, lib/attention.cuh.j2).
    """
    q, kc, vc, lens, pos, kn, vn = (ctx.ref(v) for v in op.operands)
    m, l, o = (ctx.ref(r) for r in op.results)
    ctx.need("attention")
    _, s, h, d = kc.shape
    stream = ctx.options.attn_stream > 0 and streamed(op, ctx.threads)
    return ctx.render(
        "ops/attn_partial.cu.j2", G=q.shape[1], D=d, TT=attn_tile(op), tc=kc.ctype,
        stream=stream,
        U=ctx.options.attn_tokens or stream_tokens(q.shape[1], ctx.blocks, ctx.threads),
        pipe="true" if stream_pipelined(q.shape[1], ctx.options.attn_stream) else "false",
        scratch_bytes=attn_scratch(op, ctx.kernel), q=q.ptr, kc=kc.ptr, vc=vc.ptr, S=s, H=h,
        lens=lens.ptr, pos=pos.ptr, kn=kn.ptr, vn=vn.ptr, B=cnames.dim(q.shape[0]),
        head=cnames.affine(op.attr("kv_head")), part=cnames.affine(op.attr("part")),
        parts=op.attr("parts"), tile=op.attr("tile"), scale=cnames.f32_literal(op.attr("scale")),
        m=m.ptr, l=l.ptr, o=o.ptr, scratch=ctx.scratch(op))


@emitter("attn_rescale")
def emit_attn_rescale(op, ctx) -> str:
    """CUDA of attn_rescale: [l·e, o·e] with e = exp(m − m_max), 0 for m = −inf."""
    m, l, o, mm = (ctx.ref(v) for v in op.operands)
    out = ctx.ref(op.result)
    return ctx.render("ops/attn_rescale.cu.j2", n=out.numel, D=o.shape[2], m=m.ptr, mm=mm.ptr,
                      l=l.ptr, o=o.ptr, out=out.ptr)


@emitter("attn_finish")
def emit_attn_finish(op, ctx) -> str:
    """CUDA of attn_finish: o / l, exactly 0 where l = 0."""
    lo, out = ctx.ref(op.operands[0]), ctx.ref(op.result)
    return ctx.render("ops/attn_finish.cu.j2", n=out.numel, D=out.shape[2], lo=lo.ptr,
                      out=out.ptr)


def check_append(op, kernel) -> None:
    """CompileError before codegen for a cache with symbolic sizes past the batch."""
    c = op.operands[0].type
    if not all(isinstance(n, int) for n in c.shape[1:]):
        raise CompileError(f"cache {c} with symbolic sizes past the batch", op=op.name,
                           loc=op.loc, valid="static max_seq, kv_heads, head_dim")


@emitter("kv_append", writes_operands=(0,), check=check_append)
def emit_kv_append(op, ctx) -> str:
    """CUDA of kv_append: row b of k (or v) written at cache[b, positions[b], kv_head];
    out-of-range positions skipped.
    """
    cache, x, pos = (ctx.ref(v) for v in op.operands)
    s, h, d = cache.shape[1], (cache.shape[2] if len(cache.shape) == 4 else 1), cache.shape[-1]
    return ctx.render("ops/kv_append.cu.j2", head=cnames.affine(op.attr("kv_head")),
                      n=x.numel, D=d, S=s, H=h, pos=pos.ptr, cache=cache.ptr, x=x.ptr,
                      ct=cache.ctype)
