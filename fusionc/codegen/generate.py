"""Tile-IR kernel -> CUDA C++ source (the entry point of code generation).

Execution model of the generated kernel (one ``__global__`` function per tile-IR kernel):
- the grid is ``grid * cluster`` CTAs in x; ``fc_cluster = blockIdx.x / C``, ``fc_rank`` is the
  CTA's rank in its cluster (``%cluster_ctarank``);
- every SSA tile value and every ``smem_alloc`` buffer lives in dynamic shared memory at an
  offset chosen by :mod:`fusionc.codegen.layout` (symbolic dims sized by ``max_batch``; their
  actual sizes are ``int`` arguments);
- each op is block-cooperative code run by all threads of the CTA, with ``__syncthreads()``
  where :mod:`fusionc.codegen.hazards` finds a dependence; control flow is uniform per CTA;
- kernel parameters are global pointers, followed by the symbolic dims, then extra arguments
  (grid_reduce workspace and counters, debug delay).
"""
from __future__ import annotations

import fusionc
from fusionc.codegen import checks, cnames, emitters, libs
from fusionc.codegen.body import emit_body
from fusionc.codegen.context import CodegenOptions, EmitCtx
from fusionc.codegen.layout import flatten, plan_smem
from fusionc.codegen.refs import Ref
from fusionc.codegen.render import render
from fusionc.codegen.source import KernelParam, KernelSource
from fusionc.errors import CompileError
from fusionc.ir.nodes import Graph
from fusionc.ir.printer import print_graph


def min_blocks(kernel: Graph, smem: int) -> int:
    """``__launch_bounds__``' CTAs per SM: 2 where shared memory and threads allow two (ptxas
    then keeps a 256-thread CTA within 128 registers), else 1. The cost model's occupancy
    (``fusionc.cost.model.ctas_per_sm``) assumes this; a cluster of 16 at one CTA per SM leaves
    Llama-3-8B's 8 KV-head clusters in two waves (7 resident, measured)."""
    from fusionc.cost.model import ctas_per_sm
    return min(2, ctas_per_sm(kernel, smem=smem))


def generate_cuda(kernel: Graph, options: CodegenOptions | None = None) -> KernelSource:
    """Generate the CUDA source of a tile-IR kernel.

    Args:
        kernel: a verified ``kernel`` of a module (``fusionc.ir.nodes.Graph``).
        options: code generation options (debug delay, unrolling).
    Returns:
        The source and its launch description (:class:`KernelSource`).
    Raises:
        CompileError: an op without code generation, or a configuration that cannot run
            (shared memory over 227 KB, cluster size not in 1..16, a head_dim that the
            vector path cannot handle, overlapping grid_reduce windows, ...).
    """
    options = options or CodegenOptions()
    from fusionc.codegen.streamed import generate_streamed, is_streamed
    if is_streamed(kernel):
        return generate_streamed(kernel, options)
    from fusionc.codegen.attn_units import attn_op, generate_attn_units
    if attn_op(kernel) is not None:
        return generate_attn_units(kernel, options)
    from fusionc.codegen.mla_units import generate_mla_units, mla_op
    if mla_op(kernel) is not None:
        return generate_mla_units(kernel, options)
    checks.check_kernel(kernel)
    ops = flatten(kernel)
    plan = plan_smem(kernel, lambda op: emitters.scratch_bytes(op, kernel), emitters.is_view)
    checks.check_smem(kernel, plan)
    ctx = EmitCtx(kernel, plan, options, {id(op): i for i, op in enumerate(ops)},
                  blocks=min_blocks(kernel, plan.total))
    layout = _make_refs(ctx)
    entry = ctx.stamp("entry")
    body = emit_body(ctx)
    exit_ = ctx.stamp("exit")
    stamp_base = 0
    if ctx.stamps:   # 64-bit slots per CTA after every other counter (aligned)
        ctx.workspace.counters += ctx.workspace.counters % 2
        stamp_base = ctx.workspace.counters
        ctx.workspace.counters += ctx.grid * ctx.cluster * len(ctx.stamps) * 2
    params = _params(ctx)
    from fusionc.codegen.pdl import prologue, trigger
    name = cnames.ident("fusionc", kernel.name)
    source = render(
        "kernel.cu.j2", version=fusionc.__version__, kernel_name=f"kernel @{kernel.name}",
        grid=ctx.grid, cluster=ctx.cluster, threads=ctx.threads, smem=plan.total,
        nonportable=ctx.cluster > 8, dims=", ".join(p.name for p in params if p.kind == "dim"),
        max_batch=ctx.max_batch, ir_lines=print_graph(kernel).splitlines(),
        libs=libs.render_libs(ctx.libs, delay=options.delay), decls=ctx.decls,
        cluster_dims=1 < ctx.cluster <= 8, name=name,
        params=[p.decl for p in params] or ["void"], layout=layout, body=body,
        min_blocks=ctx.blocks,
        pdl=prologue(ctx), pdl_end=trigger(ctx), entry=entry, exit=exit_, stamps=ctx.stamps,
        stamp_base=stamp_base) + "\n"
    return KernelSource(name=name, source=source, kernel=kernel, grid=ctx.grid,
                        cluster=ctx.cluster, threads=ctx.threads, smem_bytes=plan.total,
                        params=tuple(params), workspace_floats=ctx.workspace.floats,
                        counters=ctx.workspace.counters, delay=options.delay, pdl=options.pdl,
                        stamps=tuple(ctx.stamps), stamp_base=stamp_base,
                        resident=ctx.resident)


def smem_required(kernel: Graph) -> int:
    """Bytes of dynamic shared memory the generated code allocates per CTA: every SSA tile and
    ``smem_alloc`` buffer (live ranges packed, symbolic dims at ``max_batch``) plus op scratch —
    what a partitioner must keep under 227 KB (``fusionc.ir.kernel.smem_bytes`` counts only the
    buffers). No NVRTC involved. Raises CompileError for ops without code generation."""
    from fusionc.codegen.streamed import is_streamed, plan
    if is_streamed(kernel):
        return plan(kernel).smem
    checks.check_kernel(kernel)
    return plan_smem(kernel, lambda op: emitters.scratch_bytes(op, kernel),
                     emitters.is_view).total


def symbols(kernel: Graph) -> list[str]:
    """The symbolic dims used by the kernel, sorted."""
    out = set()
    for v in list(kernel.params) + [r for op in kernel.walk() for r in op.results]:
        out.update(d for d in v.type.shape if isinstance(d, str))
    return sorted(out)


def _make_refs(ctx: EmitCtx) -> list[str]:
    """Fill ``ctx.refs``; returns the layout declarations of the kernel prologue."""
    k, plan = ctx.kernel, ctx.plan
    outputs = {v.name for v in k.outputs}
    for p in k.params:
        ctx.refs[p.name] = Ref(p.name, cnames.ident("p", p.name), p.type.dtype, p.type.shape,
                               "global", ("global", p.name), p.name not in outputs)
    lines = []
    for op in k.walk():
        for r in op.results:
            root = plan.root(r.name)
            ptr = cnames.ident("v", r.name)
            if r.name in plan.aliases:
                src = ctx.refs[plan.aliases[r.name]]
                ctx.refs[r.name] = Ref(r.name, ptr, r.type.dtype, r.type.shape, src.space,
                                       src.region, src.readonly)
                const = "const " if src.readonly else ""
                lines.append(f"{const}{src.ctype}* const {ptr} = {src.ptr};  // {r.type}, a view")
                continue
            off = plan.offsets[root]
            size = next(iv.size for iv in plan.intervals if iv.name == root)
            ctx.refs[r.name] = Ref(r.name, ptr, r.type.dtype, r.type.shape, "smem",
                                   ("smem", off, off + size))
            ct = cnames.ctype(r.type.dtype)
            lines.append(f"{ct}* const {ptr} = reinterpret_cast<{ct}*>(fc_smem + {off});"
                         f"  // {r.type}, {size} B")
    return lines


def _params(ctx: EmitCtx) -> list[KernelParam]:
    out = []
    for p in ctx.kernel.params:
        r = ctx.refs[p.name]
        const = "const " if r.readonly else ""
        out.append(KernelParam(r.ptr, "tensor", f"{const}{r.ctype}* __restrict__ {r.ptr}",
                               value=p))
    for s in symbols(ctx.kernel):
        out.append(KernelParam(cnames.dim_name(s), "dim", f"const int {cnames.dim_name(s)}",
                               symbol=s))
    if ctx.workspace.counters:
        out.append(KernelParam("fc_ws", "workspace", "float* __restrict__ fc_ws"))
        out.append(KernelParam("fc_counters", "counters", "unsigned* __restrict__ fc_counters"))
    if ctx.options.delay:
        out.append(KernelParam("fc_delay_rank", "delay_rank", "const int fc_delay_rank"))
        out.append(KernelParam("fc_delay_ns", "delay_ns",
                               "const unsigned long long fc_delay_ns"))
    return out
