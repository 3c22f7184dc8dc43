"""Grid-level steps that leave the chip, and the host-side launch of a kernel.

``grid_reduce(%dst, %t, %init?) {offsets}`` (off-chip)
    Sums the tile into an output parameter across CTAs of the whole grid: each covered element
    starts from ``init`` (e.g. the residual; every contributing CTA passes the same values) or 0,
    adds the contributions in fp32 in CTA order (cluster-major), is rounded once and overwrites
    the output — deterministic: codegen has every CTA write its partial to a workspace slot and
    the last CTA to arrive at a window add the slots in this order (docs/ARCHITECTURE.md), or, where the
    whole grid is resident at the kernel's CTAs per SM, all contributors meet at a grid barrier
    and each adds a share of the elements in the same order
    (``CodegenOptions.grid_reduce_parallel``). Used for the
    output projections summed over heads or over the intermediate dimension; the fused result is
    rounded once where the graph rounds the projection and the residual add separately.
``grid_barrier()``
    Every CTA of the grid waits until all have arrived; global stores before it are visible to
    every CTA after it (a software grid barrier: fence, arrival count, generation flag, as
    cooperative groups' grid sync). Only at the top level of a kernel (every CTA reaches it),
    with no exit or grid_reduce before it, and only in kernels whose whole grid is resident at
    once (checked against an H200's resident clusters at one CTA per SM, and at load time
    against the driver's occupancy query, ``cuOccupancyMaxActiveClusters``): otherwise
    arrived CTAs would wait for CTAs that cannot start (the generated spin
    traps after 2 s rather than hang).
``%outs = launch(%args) {kernel = @k}`` (in graphs)
    Runs kernel ``@k`` with its leading parameters bound to ``%args``; the remaining
    parameters are pure outputs allocated by the runtime. Results are the kernel's returned
    parameters, in order (in-place updates of inputs such as KV caches included).
"""
from __future__ import annotations

import numpy as np

from fusionc.ir.ops.tile_memory import K, _verify_store, window
from fusionc.ir.registry import AFFINES, SYMBOL, Cost, OpDef, attr, fail, register


def _infer_grid_reduce(op):
    g, t = op.operands[0].type, op.operands[1].type
    if len(op.operands) == 3 and op.operands[2].type.shape != t.shape:
        fail(op, f"init {op.operands[2].type} does not match tile {t}", "init of the tile's shape")
    if len(op.attr("offsets")) != g.rank or t.rank != g.rank:
        fail(op, f"tile {t} and {len(op.attr('offsets'))} offsets for {g}",
             f"a tile of rank {g.rank} and {g.rank} offsets")
    return ()


def _sim_grid_reduce(op, args, cta):
    name = op.operands[0].name
    src, dst, inside = window(op, cta, cta.memory.arrays[name].shape)
    if not inside:
        from fusionc.ir.ops.tile_memory import _bounds_error
        _bounds_error(op, cta, cta.memory.arrays[name].shape)
    init = np.asarray(args[2])[tuple(dst)] if len(args) == 3 else None
    cta.memory.add_reduction(name, tuple(src), np.asarray(args[1])[tuple(dst)], cta, init)
    return ()


def _verify_launch(op, graph, module):
    if module is None:
        return
    ref = op.attr("kernel").name
    if ref not in module.names or module[ref].kind != "kernel":
        fail(op, f"@{ref} is not a kernel of this module", "a kernel defined in the module")
    k = module[ref]
    n = len(op.operands)
    if n > len(k.params) or any(a.type != p.type for a, p in zip(op.operands, k.params)):
        fail(op, "arguments (" + ", ".join(str(a.type) for a in op.operands) + ") do not match "
             f"@{ref}'s parameters", "(" + ", ".join(str(p.type) for p in k.params) + ")")
    outs = {v.name for v in k.outputs}
    if any(p.name not in outs for p in k.params[n:]):
        fail(op, f"@{ref} has parameters past the {n} arguments that it does not return",
             "arguments for every input parameter")
    if tuple(r.type for r in op.results) != tuple(v.type for v in k.outputs):
        fail(op, "results do not match the kernel's returned parameters",
             "(" + ", ".join(str(v.type) for v in k.outputs) + ")")



def _cost_grid_reduce(op, env):
    """fp32 partial written to and read back from the workspace, the output written once."""
    t = op.operands[1].type
    n = t.numel(env)
    return Cost(bytes_read=4 * n, bytes_written=4 * n + n * op.operands[0].type.dtype.itemsize)

register(OpDef("grid_reduce", __doc__, ("dst", "tile", "init?"),
               (attr("offsets", AFFINES),), _infer_grid_reduce, where=K,
               simulate=_sim_grid_reduce, verify=_verify_store, cost=_cost_grid_reduce))
def _verify_grid_barrier(op, graph, module):
    if graph is None:
        return
    if not any(o is op for o in graph.body):
        fail(op, "grid_barrier inside a region", "grid_barrier at the top level of the kernel")
    before = []
    for o in graph.walk():
        if o is op:
            break
        before.append(o.name)
    if "exit" in before or "grid_reduce" in before:
        what = "exit" if "exit" in before else "grid_reduce"
        fail(op, f"a grid_barrier after {what}",
             "no exit before a grid barrier (the exited CTA never arrives) and no grid_reduce "
             "(its sums are complete only at the kernel's end)")
    from fusionc.cost.h200 import H200   # clusters resident at once, measured on the project's H200
    grid, size = graph.attr("grid"), graph.attr("cluster")
    if not H200.resident(grid, size):
        fail(op, f"a grid of {grid} clusters of {size} CTAs with a grid barrier",
             f"at most {H200.resident_clusters.get(size, 0)} clusters of {size} (all resident "
             "at once, one CTA per SM)")


def _cost_grid_barrier(op, env):
    return Cost()


register(OpDef("grid_barrier", __doc__, (), (), lambda op: (), where=K, collective=True,
               verify=_verify_grid_barrier, cost=_cost_grid_barrier))


register(OpDef("launch", __doc__, ("args*",), (attr("kernel", SYMBOL),),
               lambda op: tuple(r.type for r in op.results), verify=_verify_launch))
