"""Emitters of grid_reduce (the deterministic cross-CTA reduction, templates/ops/grid_reduce)
and grid_barrier.

grid_reduce: the last CTA to arrive at a window sums its slots, or on resident grids every
contributor sums a share (:func:`parallel_reduce`); the CTA that writes an element takes
``init`` (every contributor passes the same values, e.g. the residual) from its own copy."""
from __future__ import annotations

from fusionc.codegen import cnames, tiles
from fusionc.codegen.emitters import emitter
from fusionc.codegen.grid_plan import plan_grid_reduce


def _table(name: str, values) -> str:
    body = ", ".join(str(v) for v in values) or "0"
    return f"__device__ const int {name}[] = {{{body}}};"


@emitter("grid_reduce", writes_operands=(0,), scratch=lambda op, k: 16,
         check=lambda op, k: plan_grid_reduce(k, op))
def emit_grid_reduce(op, ctx) -> str:
    """CUDA of grid_reduce: partial to a workspace slot, fence; then either the last CTA to
    arrive at the window's counter sums the slots in CTA order from init, writes, and resets
    the counter, or (:func:`parallel_reduce`) all contributors meet at a grid barrier and each
    sums a share of the elements, in the same order.
    """
    dst, t = ctx.ref(op.operands[0]), ctx.ref(op.operands[1])
    init = f"fc_f32({ctx.ref(op.operands[2]).ptr}[i])" if len(op.operands) > 2 else "0.f"
    plan = plan_grid_reduce(ctx.kernel, op)
    tab = ctx.uid("fc_gr")
    first = [0]
    for m in plan.members:
        first.append(first[-1] + len(m))
    index = [plan.members[w].index(g) if w >= 0 else -1 for g, w in enumerate(plan.window)]
    ctx.decls += [f"// grid_reduce at {op.loc}: {len(plan.members)} output window(s)",
                  _table(f"{tab}_window", plan.window), _table(f"{tab}_first", first),
                  _table(f"{tab}_members", [g for m in plan.members for g in m]),
                  _table(f"{tab}_index", index)]
    parallel = parallel_reduce(ctx)
    slot = t.max_numel(ctx.max_batch)
    ws_base, ctr_base = ctx.workspace.floats, ctx.workspace.counters
    ctx.workspace.floats += slot * ctx.grid * ctx.cluster
    ctx.workspace.counters += 2 if parallel else len(plan.members)
    ctx.resident |= parallel
    unflat, coords = tiles.unflatten("i", tiles.shape_c(t.shape), "t")
    g = [f"(o{k} + {c})" for k, c in enumerate(coords)]
    from fusionc.codegen.pdl import trigger
    pdl = trigger(ctx)
    return (pdl + "\n" if pdl else "") + ctx.render(
        "ops/grid_reduce.cu.j2", ws_base=ws_base, slot=slot, tab=tab, n=t.numel, src=t.ptr,
        scratch=ctx.scratch(op), ctr_base=ctr_base, offs=[cnames.affine(a) for a in
                                                          op.attr("offsets")],
        unflat=unflat, dst=dst.ptr, goff=tiles.linear(g, tiles.shape_c(dst.shape)),
        dt=dst.ctype, init=init, parallel=parallel, members=first[-1],
        timeout_s=GRID_BARRIER_TIMEOUT_S)


def parallel_reduce(ctx) -> bool:
    """Whether grid_reduce sums in parallel over its contributors (CodegenOptions.
    grid_reduce_parallel): only where the whole grid is resident on an H200 at the kernel's CTAs
    per SM (``H200.resident`` with ``ctx.blocks``, the ``__launch_bounds__`` occupancy), since
    contributors wait for each other."""
    from fusionc.cost.h200 import H200
    return bool(ctx.options.grid_reduce_parallel) and H200.resident(ctx.grid, ctx.cluster,
                                                                   ctx.blocks)


GRID_BARRIER_TIMEOUT_S = 2  # a grid that cannot be resident traps after this (never hangs)


@emitter("grid_barrier")
def emit_grid_barrier(op, ctx) -> str:
    """CUDA of grid_barrier: two counters (arrivals, generation) in the kernel's workspace."""
    base = ctx.workspace.counters
    ctx.workspace.counters += 2
    ctx.resident = True
    return ctx.render("ops/grid_barrier.cu.j2", base=base, timeout_s=GRID_BARRIER_TIMEOUT_S,
                      arrive=ctx.stamp(f"grid barrier at ir {_line(op)}: arrive"),
                      leave=ctx.stamp(f"grid barrier at ir {_line(op)}: leave"))


def _line(op) -> str:
    return f"{op.loc.line}" if op.loc is not None else "?"
