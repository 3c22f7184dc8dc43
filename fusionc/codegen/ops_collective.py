"""Emitters of the cluster collectives over distributed shared memory (ClusterFusion, arXiv
2508.18850): cluster_reduce and cluster_gather.

Both are "all-read": every CTA reads the operand buffer of each of the C CTAs of its cluster
(``mapa`` + ``ld.shared::cluster``, 16-byte loads where the payload allows) — C reads per
element instead of log2(C) rounds of exchange, and no extra barriers: the IR's cluster barriers
around the collective are the only synchronisation needed. ClusterReduce then combines the C
values in registers in exactly the order of the recursive-doubling schedule ``masks``
(``fusionc.ir.ops.tile_collective._reduce_values``: at each step rank r combines with rank
r ^ mask, lower rank on the left). After the last step every rank holds the same expression,
so each CTA computes it once and all CTAs get identical bits, equal to the simulator's in fp32.
"""
from __future__ import annotations

from fusionc.codegen import cnames, tiles
from fusionc.codegen.emitters import emitter
from fusionc.errors import CompileError
from fusionc.ir.ops.tile_collective import butterfly, default_masks


def butterfly_expr(size: int, masks, combine: str, leaf) -> str:
    """The C expression the butterfly over ``masks`` leaves on every rank (``leaf(r)`` is rank
    r's value), from the simulator's own :func:`~fusionc.ir.ops.tile_collective.butterfly`, so
    both add in the same order. Raises CompileError for a schedule that misses or repeats a
    rank."""
    try:
        vals = butterfly([leaf(r) for r in range(size)], masks,
                         lambda a, b: f"{combine}({a}, {b})")
    except ValueError as e:
        raise CompileError(str(e), op="cluster_reduce",
                           valid=f"a permutation of {list(default_masks(size))}") from None
    assert len(set(vals)) == 1, "butterfly must leave one expression on every rank"
    return vals[0]


def check_reduce(op, kernel) -> None:
    """CompileError before codegen for a cluster_reduce of a buffer that is not f16, bf16 or
    f32."""
    if op.operands[0].type.dtype.value not in ("f16", "bf16", "f32"):
        raise CompileError(f"cluster_reduce of {op.operands[0].type.dtype}", op=op.name,
                           loc=op.loc, valid="a buffer of f16, bf16 or f32")


@emitter("cluster_reduce", collective=True, check=check_reduce)
def emit_cluster_reduce(op, ctx) -> str:
    """CUDA of cluster_reduce: every CTA reads all peers' buffers over DSM and combines them in the
    op's butterfly order (bit-identical on every CTA).
    """
    buf, out = ctx.ref(op.operands[0]), ctx.ref(op.result)
    c = ctx.cluster
    combine = "fc_sum" if op.attr("op") == "sum" else "fc_max"
    try:
        vexpr = butterfly_expr(c, op.attr("masks"), combine,
                               lambda r: f"fc_lane<{buf.ctype}>(r{r}, j)")
        sexpr = butterfly_expr(c, op.attr("masks"), combine, lambda r: f"x{r}")
    except CompileError as e:
        raise CompileError(e.message, op=op.name, loc=op.loc, valid=e.valid) from None
    return ctx.delay() + ctx.render(
        "ops/cluster_reduce.cu.j2", C=c, buf=buf.ptr, bt=buf.ctype, out=out.ptr, ot=out.ctype,
        n=buf.numel, V=tiles.vector_elems(buf.itemsize), isz=buf.itemsize, vexpr=vexpr,
        sexpr=sexpr)


@emitter("cluster_gather", collective=True)
def emit_cluster_gather(op, ctx) -> str:
    """CUDA of cluster_gather: every CTA copies all peers' buffers over DSM in rank order."""
    buf, out = ctx.ref(op.operands[0]), ctx.ref(op.result)
    shape = buf.shape
    axis = op.attr("axis") % len(shape)
    piece_dims = shape[axis:]
    v = tiles.vector_elems(buf.itemsize)
    vec = cnames.static_part(piece_dims) % v == 0
    piece = cnames.product(piece_dims)
    return ctx.delay() + ctx.render(
        "ops/cluster_gather.cu.j2", C=ctx.cluster, buf=buf.ptr, bt=buf.ctype, out=out.ptr,
        outer=cnames.product(shape[:axis]), piece=f"({piece} / {v})" if vec else piece,
        vec=vec, V=v, isz=buf.itemsize)

