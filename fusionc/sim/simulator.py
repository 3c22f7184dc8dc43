"""Run tile-IR kernels (and modules that launch them) in numpy.

Scheduling: the CTAs of one cluster run in lockstep. Each CTA executes its ops in program order
until it reaches a collective op (``cluster_barrier``, ``cluster_reduce``, ``cluster_gather``);
when every CTA of the cluster waits at the same collective, it is performed for all of them
together. A CTA that exits while others wait, or CTAs waiting at different collectives, is a
SimulationError (on the GPU: a hang or garbage). Clusters run one after another: a kernel must
not depend on the order of clusters (global-memory rules in :mod:`fusionc.sim.state`).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from fusionc.errors import InputError, SimulationError
from fusionc.interp.interpreter import Context, _store, bind_ranks
from fusionc.interp.numerics import round_to
from fusionc.ir.nodes import Graph, Module, Op
from fusionc.ir.registry import lookup
from fusionc.ir.types import bind_shapes
from fusionc.sim.state import CTA, CTAExit, GlobalMemory


def simulate_kernel(kernel: Graph, args: dict[str, np.ndarray],
                    env: dict[str, int] | None = None, *, grid: int | None = None,
                    seed: int = 0, lazy_copies: bool = False) -> dict[str, np.ndarray]:
    """Run ``kernel`` on ``args`` (parameter name -> array, all parameters given).

    A streamed kernel (one with a ``units`` region) runs as interleaved coroutines over a
    virtual grid of ``grid`` CTAs (default :data:`fusionc.sim.grid.VIRTUAL_GRID`), scheduled by
    a random generator seeded with ``seed`` (:func:`fusionc.sim.grid.run_streamed`).

    Arrays are copied, rounded to the parameter dtypes, and the kernel's outputs (the
    parameters it returns) are returned by name. ``env`` binds symbolic dims; missing symbols
    are taken from the argument shapes.

    Raises:
        InputError: missing argument or wrong shape.
        SimulationError: the program breaks the execution model (see module docstring).
    """
    env = bind_shapes(kernel.params, {k: np.shape(v) for k, v in args.items()}, kernel.name,
                      env)
    memory = GlobalMemory({p.name: round_to(np.asarray(args[p.name]), p.type.dtype)
                           for p in kernel.params})   # round_to returns a new array
    from fusionc.sim.grid import run_streamed, units_op
    if units_op(kernel) is not None:
        run_streamed(kernel, memory, env, grid, seed, lazy_copies)
        return {v.name: memory.arrays[v.name] for v in kernel.outputs}
    grid, size = kernel.attr("grid"), kernel.attr("cluster")
    clusters = [_run_cluster(kernel, cid, size, env, memory) for cid in range(grid)]
    while clusters:   # every cluster runs to its next grid_barrier (or its end), then all resume
        at = [_advance(c) for c in clusters]
        waiting = [c for c, a in zip(clusters, at) if a is not None]
        first = next((a for a in at if a is not None), None)
        if waiting and (len(waiting) != len(clusters) or any(a is not first for a in at)):
            raise SimulationError(
                "clusters wait at different grid_barriers, or some finished while others wait "
                "(a hang on the GPU)", op=first.name, loc=first.loc,
                valid="every grid_barrier reached by every CTA of the grid, in the same order")
        if waiting:
            memory.grid_sync()
        clusters = waiting
    memory.finish_reductions({p.name: p.type.dtype for p in kernel.params})
    return {v.name: memory.arrays[v.name] for v in kernel.outputs}


def _run_cluster(kernel: Graph, cid: int, size: int, env: dict,
                 memory: GlobalMemory) -> Iterator[Op]:
    """Run cluster ``cid`` in lockstep over its CTAs; yields at each grid_barrier."""
    ctas = [CTA(cid, r, size, env, memory) for r in range(size)]
    for cta in ctas:
        for p in kernel.params:
            cta.values[p.name] = p  # global parameters are referenced, not loaded
    progs = [_program(kernel.body, cta) for cta in ctas]
    waiting: list[Op | None] = [_advance(p) for p in progs]
    while any(w is not None for w in waiting):
        _check_same_collective(waiting, ctas)
        op = waiting[0]
        if op.name == "grid_barrier":   # the grid scheduler (simulate_kernel) resumes us
            yield op
            for cta in ctas:   # a grid barrier also ends the cluster's barrier phase
                cta.phase += 1
            waiting = [_advance(p) for p in progs]
            continue
        results = lookup(op.name).simulate(op, ctas)
        for cta, res in zip(ctas, results):
            _assign(op, cta, res)
        waiting = [_advance(p) for p in progs]


def _program(ops, cta: CTA) -> Iterator[Op]:
    try:
        yield from _run_ops(ops, cta)
    except CTAExit:
        pass
    cta.exited = True
    _check_exit(cta)


def _run_ops(ops, cta: CTA) -> Iterator[Op]:
    for op in ops:
        d = lookup(op.name)
        if d.collective:
            yield op
            continue
        args = [cta.values[v.name] for v in op.operands]
        if d.simulate is None:  # graph ops inside kernels: their interpreter rule, rounded
            out = _interpret_op(op, args, Context(0, [cta.values], cta.env, False))
            _assign(op, cta, out)
            continue
        out = d.simulate(op, args, cta)
        if isinstance(out, Iterator):  # region ops (when) run nested programs
            out = yield from out
        _assign(op, cta, out)


def _assign(op: Op, cta: CTA, results) -> None:
    for v, x in zip(op.results, results or ()):
        cta.values[v.name] = x


def _advance(prog) -> Op | None:
    try:
        return next(prog)
    except StopIteration:
        return None


def _check_same_collective(waiting: list, ctas: list[CTA]) -> None:
    first = next(w for w in waiting if w is not None)
    for cta, w in zip(ctas, waiting):
        if w is None:
            raise SimulationError(
                f"CTA {cta.rank} of cluster {cta.cluster} has exited while its peers wait at "
                f"'{first.name}' (a collective not reached by every CTA: a hang on the GPU)",
                op=first.name, loc=first.loc,
                valid="collectives reached by all CTAs; exit only after the last collective")
        if w is not first:
            raise SimulationError(
                f"CTAs of cluster {cta.cluster} wait at different collectives: rank 0 at "
                f"'{first.name}' ({first.loc}), rank {cta.rank} at '{w.name}' ({w.loc})",
                op=w.name, loc=w.loc, valid="the same sequence of collectives on every CTA")


def _check_exit(cta: CTA) -> None:
    for buf in cta.smem.values():
        if buf.peer_read_phase == cta.phase:
            by = buf.peer_read_by
            raise SimulationError(
                f"CTA {cta.rank} of cluster {cta.cluster} exits while peers may still read its "
                f"shared memory %{buf.name} (read by '{by.name}' at {by.loc} in this barrier "
                "phase)", op=by.name, loc=by.loc,
                valid="a cluster_barrier() after the last collective, before any CTA exits")


def simulate(module: Module, inputs, graph: str | None = None,
             env: dict[str, int] | None = None):
    """Run graph ``graph`` of ``module`` (default: its first graph): graph ops through their
    interpreter rules (fp32, rounded to each result dtype), ``launch`` ops through
    :func:`simulate_kernel`. Returns the graph's outputs in order.

    Several ranks (tensor parallelism): ``inputs`` is a list of dicts, one per simulated rank;
    the ranks run in lockstep, op by op, so the collectives (``all_reduce`` and its fused forms)
    see every rank's operands; returns one tuple of outputs per rank.
    """
    graphs = [x for x in module.graphs if x.kind == "graph"]
    g = next((x for x in graphs if graph in (None, x.name)), None)
    if g is None:
        raise InputError(f"no graph named {graph!r}" if graph else "the module has no graph",
                         valid="graph= one of " + ", ".join(x.name for x in graphs))
    values, env_b, many = bind_ranks(g, inputs)
    env = {**env_b, **(env or {})}
    for op in g.body:
        results = []
        for r, vals in enumerate(values):
            args = [vals[v.name] for v in op.operands]
            if op.name == "launch":
                results.append(_launch(module[op.attr("kernel").name], args, env))
                continue
            if lookup(op.name).interpret is None:
                raise SimulationError("op has no interpreter rule", op=op.name, loc=op.loc)
            results.append(_interpret_op(op, args, Context(r, values, env, False)))
        for vals, outs in zip(values, results):   # results join once every rank ran the op
            for v, x in zip(op.results, outs):
                vals[v.name] = x
    outs = [tuple(vals[v.name] for v in g.outputs) for vals in values]
    return outs if many else outs[0]


def _interpret_op(op: Op, args: list, ctx) -> tuple:
    outs = lookup(op.name).interpret(op, args, ctx)
    return tuple(_store(x, r, ctx, op) for x, r in zip(outs, op.results))


def _launch(k: Graph, args: list, env) -> tuple:
    given = dict(zip((p.name for p in k.params), args))
    for p in k.params[len(args):]:  # pure outputs: poisoned, must be written
        given[p.name] = np.full(p.type.concrete(env), np.nan, p.type.dtype.numpy)
    out = simulate_kernel(k, given, env)
    return tuple(out[v.name] for v in k.outputs)
