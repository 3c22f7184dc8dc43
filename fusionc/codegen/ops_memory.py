"""Emitters of the memory ops: load, store, smem_alloc, smem_store, smem_load.

Global tiles are copied element by element (converting dtypes through fp32), or in 16-byte
units along the last axis when the compile-time shapes allow it: same dtype on both sides, the
tile's and the tensor's last dims multiples of 16 bytes, and the last-axis offset a multiple of
16 bytes for every CTA (all its affine coefficients are). Masked elements read 0 / are dropped.
"""
from __future__ import annotations

from fusionc.codegen import cnames, tiles
from fusionc.codegen.emitters import emitter


def _vector_ok(tile_shape, gshape, off, tile_dt, g_dt) -> int:
    """Elements per 16-byte unit if the tile can move in 16-byte units, else 0."""
    if tile_dt != g_dt or not tile_shape:
        return 0
    v = tiles.vector_elems(g_dt.itemsize)
    last, glast = tile_shape[-1], gshape[-1]
    if not (isinstance(last, int) and isinstance(glast, int)):
        return 0
    if last % v or glast % v or not cnames.affine_aligned(off, v):
        return 0
    return v


def tile_copy_vars(ctx, op, gref, tref, dt) -> dict:
    """Template variables of a tile copy between global ``gref`` and shared ``tref``."""
    offs = op.attr("offsets")
    v = _vector_ok(tref.shape, gref.shape, offs[-1], tref.dtype, gref.dtype) if offs else 0
    sizes = tiles.shape_c(tref.shape)
    if v:
        sizes[-1] = str(tref.shape[-1] // v)
    unflat, coords = tiles.unflatten("i", sizes, "t")
    gshape = tiles.shape_c(gref.shape)
    g = [f"(o{k} + {c}{' * ' + str(v) if v and k == len(coords) - 1 else ''})"
         for k, c in enumerate(coords)]
    inside = " && ".join(f"{x} >= 0 && {x} < {n}" for x, n in zip(g, gshape)) or "true"
    n = cnames.product(tref.shape)
    if v:
        n = f"({n} / {v})"
    return dict(offs=[cnames.affine(a) for a in offs], n=n, unflat=unflat,
                goff=tiles.linear(g, gshape), inside=inside, masked=op.attr("masked"),
                vec=bool(v), V=v, dt=cnames.ctype(dt))


@emitter("load")
def emit_load(op, ctx) -> str:
    """CUDA of load: a global tile copied into shared memory (masked elements read 0)."""
    g, t = ctx.ref(op.operands[0]), ctx.ref(op.result)
    kw = tile_copy_vars(ctx, op, g, t, t.dtype)
    return ctx.render("ops/load.cu.j2", src=g.ptr, dst=t.ptr, U=ctx.options.load_batch, **kw)


@emitter("store", writes_operands=(0,))
def emit_store(op, ctx) -> str:
    """CUDA of store: a tile written to global memory, rounded to its dtype (masked elements
    dropped).
    """
    g, t = ctx.ref(op.operands[0]), ctx.ref(op.operands[1])
    kw = tile_copy_vars(ctx, op, g, t, g.dtype)
    return ctx.render("ops/store.cu.j2", src=t.ptr, dst=g.ptr, **kw)


@emitter("smem_alloc")
def emit_alloc(op, ctx) -> str:
    """smem_alloc needs no code: the buffer has its offset in the shared-memory plan."""
    r = ctx.ref(op.result)
    return f"// {r.ptr}: {op.result.type} at shared-memory offset {ctx.plan.offsets[r.name]}"


def copy(ctx, src, dst) -> str:
    """dst[i] = src[i] (converted) for every element of dst."""
    return ctx.render("ops/copy.cu.j2", src=src.ptr, dst=dst.ptr, n=dst.numel, dt=dst.ctype)


@emitter("smem_store", writes_operands=(0,))
def emit_smem_store(op, ctx) -> str:
    """CUDA of smem_store: the tile copied into the CTA's own buffer, rounded to its dtype."""
    return ctx.delay() + copy(ctx, ctx.ref(op.operands[1]), ctx.ref(op.operands[0]))


@emitter("smem_load")
def emit_smem_load(op, ctx) -> str:
    """CUDA of smem_load: the CTA's own buffer copied into the result tile."""
    return copy(ctx, ctx.ref(op.operands[0]), ctx.ref(op.result))
