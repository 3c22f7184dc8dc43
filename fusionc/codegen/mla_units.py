"""CUDA of an MLA-units kernel (``mla_units``, :mod:`fusionc.ir.ops.tile_mla_units`):
``templates/mla_units.cu.j2``.

Launch: min(the op's ``grid``, the CTAs resident at once) CTAs of eight warps, no cluster;
arguments: the kernel's tensors in parameter order, the symbolic dims, the partial slots
(``fc_ws``: :func:`fusionc.ir.ops.tile_mla_units.slots` × HB·(L + 2) floats) and per (row,
head block) an arrival counter, then per (row, head block) one per merge group of
``MERGE_GROUP`` chunks (``fc_counters``, left zero by every launch), then the error
word of the streamed kernels' interface (nothing waits: it stays 0). PDL as ``attn_units``.
"""
from __future__ import annotations

import fusionc
from fusionc.codegen import cnames, libs
from fusionc.codegen.render import render
from fusionc.codegen.source import KernelSource
from fusionc.errors import CompileError
from fusionc.ir.kernel import SMEM_LIMIT
from fusionc.ir.nodes import Graph, Op
from fusionc.ir.types import DType
from fusionc.ir.ops.tile_attn_units import MAX_SPLITS, UNIT_OVERHEAD, WAVES
from fusionc.ir.ops.tile_mla_units import (MERGE_GROUP, head_blocks, merge_groups,
                                          mla_merge_loads, slots, unsupported)
from fusionc.ir.printer import print_graph

TOK = 32          # cache rows per ring stage (two 16-token k-steps of P·V)
MAX_STAGES = 3


def mla_op(kernel: Graph) -> Op | None:
    """The kernel's ``mla_units`` op, if it is an MLA-units kernel."""
    return next((op for op in kernel.body if op.name == "mla_units"), None)


def _up16(n: int) -> int:
    return -(-n // 16) * 16


def geometry(op: Op, threads: int, max_batch: int) -> dict:
    """Heads, blocks, L, R, S, ring stages and the shared-memory layout (byte offsets) of the
    template: the ring ([STAGES][TOK][D + 8], also the merge's weights), the queries
    ([HB][D + 8]), the new row, P ([HB][TOK + 8]), the scores' K parts ([KS][HB][TOK] f32: S
    is split over K so that every warp has a part), m/l/alpha, RoPE's angles, the plan's sums
    and the unit prefix."""
    ql, cache = op.operands[1].type, op.operands[3].type
    heads, lat = ql.shape[1], ql.shape[2]
    d, S = cache.shape[2], cache.shape[1]
    hb, isz, warps = op.attr("block"), cache.dtype.itemsize, threads // 32
    kparts = warps // (2 * (hb // 16))   # S: every warp, a (16 heads, 16 tokens) tile's K part
    step = TOK * (d + 8) * isz
    sizes = [("q", hb * (d + 8) * isz), ("new", d * isz), ("p", hb * (TOK + 8) * isz),
             ("s", kparts * hb * TOK * 4), ("m", 3 * hb * 4), ("cs", (d - lat) * 4),
             ("red", 4 * (2 * WAVES + warps)), ("first", 4 * (max_batch + 1))]
    rest = sum(_up16(n) for _, n in sizes)
    merge = (MAX_SPLITS + 1) * hb * 4
    stages = MAX_STAGES
    while stages > 2 and max(stages * step, merge) + rest > SMEM_LIMIT:
        stages -= 1
    off, at = {}, _up16(max(stages * step, merge))
    for name, n in sizes:
        off[name], at = at, at + _up16(n)
    return dict(H=heads, HB=hb, NB=head_blocks(heads, hb), L=lat, R=d - lat, S=S,
                stages=stages, off=off, smem=at, kparts=kparts)


def _check(kernel: Graph, op: Op, geo: dict) -> None:
    bad = unsupported(op.operands[0].type.dtype, geo["H"], geo["L"], geo["R"])
    if not bad and geo["smem"] > SMEM_LIMIT:
        bad.append(f"{geo['H']} heads of latent {geo['L']} + rope {geo['R']} with a bucket of "
                   f"{kernel.attr('max_batch')} rows ({geo['smem']} bytes of shared memory)")
    if bad:
        raise CompileError("MLA units cannot take " + ", ".join(bad), op=op.name, loc=op.loc,
                           valid="f16, bf16 or f32, at most 128 heads, a latent dim a "
                                 "multiple of 64, a rope dim a multiple of 16, within 227 KB "
                                 "of shared memory")


def generate_mla_units(kernel: Graph, options=None) -> KernelSource:
    """The CUDA source and launch of an MLA-units kernel (module docstring).

    Raises:
        CompileError: a geometry, batch bucket or dtype the template does not take.
    """
    op = mla_op(kernel)
    threads, mb = kernel.attr("threads"), kernel.attr("max_batch")
    geo = geometry(op, threads, mb)
    _check(kernel, op, geo)
    from fusionc.codegen.attn_units import batch_dim, unit_params
    params, names, freq, name = unit_params(kernel, op)
    rot = op.attr("rotary_dim")
    source = render(
        "mla_units.cu.j2", version=fusionc.__version__, kernel_name=f"kernel @{kernel.name}",
        ir_lines=print_graph(kernel).splitlines(), name=name,
        libs=libs.render_libs({"mma", "attention", "stream"}), stages=geo["stages"],
        params=[kp.decl for kp in params], T=cnames.ctype(op.operands[0].type.dtype),
        H=geo["H"], HB=geo["HB"], NB=geo["NB"], L=geo["L"], R=geo["R"], S=geo["S"],
        nope=op.attr("nope"), tile=op.attr("tile"), tok=TOK, grid=op.attr("grid"),
        threads=threads, max_batch=mb, max_splits=MAX_SPLITS, merge_group=MERGE_GROUP,
        wmax=WAVES, c0=UNIT_OVERHEAD, merge_loads=mla_merge_loads(mb),
        kparts=geo["kparts"], fma=op.operands[0].type.dtype == DType.f32,
        CW=geo["L"] // (threads // 32 // (geo["HB"] // 16)),
        scale=cnames.f32_literal(op.attr("scale")), rot=rot, style=op.attr("style"),
        inv_freq=freq, norm=len(op.operands) == 8, eps=repr(float(op.attr("eps"))), off=geo["off"],
        q=names[0], q_latent=names[1], kv_a=names[2], cache=names[3], pos=names[4],
        lens=names[5], o=names[6], kv_norm=names[7] if len(names) > 7 else "",
        dim_B=batch_dim(op)) + "\n"
    return KernelSource(name=name, source=source, kernel=kernel, grid=op.attr("grid"),
                        cluster=1, threads=threads, smem_bytes=geo["smem"], params=tuple(params),
                        workspace_floats=slots(mb, geo["NB"], op.attr("grid")) *
                        geo["HB"] * (geo["L"] + 2),
                        counters=mb * geo["NB"] * (1 + merge_groups(MAX_SPLITS)) + 1,
                        resident=True,
                        persistent_units=op.attr("grid"), pdl=True)
