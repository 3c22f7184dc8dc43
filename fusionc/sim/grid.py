"""Simulate a streamed persistent kernel: the CTAs of a small virtual grid as interleaved
coroutines (design v2 §6).

Every CTA runs its top-level ops up to the ``units`` region, then two coroutines over its work
units (:class:`fusionc.stream.UnitSchedule` for the virtual grid): the *producer* runs the ops
with the ``producer`` trait (``ring_claim``, ``ring_issue``), the *consumer* everything else;
then the ops after the region. Bulk copies land as separate events. A seeded random scheduler
picks, at every step, one runnable coroutine or one pending copy; ``lazy_copies`` lets copies
land only when nothing else can run (the latest legal moment), which exposes missing waits
deterministically. When nothing can run and some coroutine still waits, the run is a hang on the
GPU, reported as ``a counter nothing signals`` (no op of the kernel, or none still to run,
signals the awaited counter) or ``a wait cycle``. Ring hazards come from
:mod:`fusionc.sim.stream_state`.

The result must not depend on the grid size, the seed or the interleaving: tests run several.
"""
from __future__ import annotations

import random
from typing import Iterator

from fusionc.errors import InputError, SimulationError
from fusionc.ir.nodes import Graph, Op
from fusionc.ir.ops.tile_units import in_producer, phases_of, units_op
from fusionc.ir.registry import lookup
from fusionc.sim.state import CTA, GlobalMemory
from fusionc.sim.stream_state import Block, Grid, StreamCTA
from fusionc.stream.schedule import UnitSchedule

VIRTUAL_GRID = 6   # CTAs simulated by default (the GPU runs min(resident CTAs, units))


def run_streamed(kernel: Graph, memory: GlobalMemory, env: dict, grid: int | None = None,
                 seed: int = 0, lazy_copies: bool = False) -> None:
    """Run ``kernel`` (with a ``units`` region) on ``memory`` over ``grid`` virtual CTAs."""
    phases = phases_of(kernel)
    count = max(op.attr("count") for op in phases)
    if grid is not None and (isinstance(grid, bool) or not isinstance(grid, int) or grid < 1):
        raise InputError(f"grid = {grid!r}", op=kernel.name,
                         valid="a positive number of virtual CTAs, or None")
    mb = kernel.attr("max_batch")
    for sym, n in env.items():
        if n > mb:
            raise InputError(f"{sym} = {n} exceeds the kernel's max_batch = {mb}", op=kernel.name,
                             valid=f"{sym} <= {mb}, or a kernel compiled for a larger bucket")
    g = UnitSchedule.launch_grid(count, grid or min(VIRTUAL_GRID, kernel.attr("grid")))
    state = Grid([UnitSchedule(op.attr("count"), op.attr("group"), min(g, op.attr("count")))
                  for op in phases], size=g)
    rng = random.Random(seed)
    coros: list[list] = []   # [generator, pending Block or None]
    for cid in range(g):
        cta = CTA(cid, 0, 1, env, memory)
        for p in kernel.params:
            cta.values[p.name] = p
        cta.stream = StreamCTA(cta, state, kernel)
        coros.append([_cta_program(kernel, phases, cta, coros), None])
    while True:
        live = [c for c in coros if c[0] is not None]
        if not live and not state.copies:
            break
        ready = [c for c in live if c[1] is None or c[1].ready()]
        events = ready + ([] if lazy_copies and ready else list(state.copies))
        if not events:
            _hang(kernel, [c[1] for c in live])
        pick = rng.choice(events)
        if not isinstance(pick, list):   # a copy lands
            state.copies.remove(pick)
            pick.land()
            continue
        try:
            pick[1] = next(pick[0])
        except StopIteration:
            pick[0], pick[1] = None, None


def _cta_program(kernel: Graph, phases: list, cta: CTA, coros: list) -> Iterator:
    """The CTA's main coroutine: prologue ops, the two roles over the units of every phase,
    epilogue ops."""
    body = list(kernel.body)
    at, end = body.index(phases[0]), body.index(phases[-1])
    yield from _run([op for op in body[:at] if op.name != "attn_units"], cta, "consumer")
    idx = [body.index(u) for u in phases]   # an attention phase: the consumers', before a phase
    between = [[op for op in body[:at] if op.name == "attn_units"]] + \
        [body[a + 1:b] for a, b in zip(idx, idx[1:])]
    roles = [[_role(phases, cta, r, between), None] for r in ("producer", "consumer")]
    coros.extend(roles)
    while any(r[0] is not None for r in roles):
        yield Block(lambda: all(r[0] is None for r in roles), f"CTA {cta.gid} joins its warps",
                    phases[-1])
    yield from _run(body[end + 1:], cta, "consumer")


def _role(phases: list, cta: CTA, role: str, between: list) -> Iterator:
    """One role (producer or consumers) over the CTA's units of each phase in turn; ``j``, the
    ring's stage index, runs on over the phases (as in the generated kernel). The consumers
    run the top-level ops between phase ``p - 1`` and ``p`` (``between[p]``: an attention
    phase) before phase ``p``'s units."""
    j = 0
    for p, uop in enumerate(phases):
        if role == "consumer" and between[p]:
            cta.stream.phase[role] = p
            yield from _run(between[p], cta, role)
        ops = [op for op in uop.regions[0] if in_producer(op) == (role == "producer")]
        for u in cta.stream.grid.scheds[p].units(cta.gid):
            cta.stream.pos[role] = (j, u)
            cta.stream.phase[role] = p
            yield from _run(ops, cta, role)
            j += 1


def _run(ops, cta: CTA, role: str) -> Iterator:
    for op in ops:
        d = lookup(op.name)
        if d.collective or d.has("units"):
            raise SimulationError("op not supported in a streamed kernel", op=op.name,
                                  loc=op.loc, valid="ring, unit, counter and tile ops")
        cta.stream.role = role
        args = [cta.values[v.name] for v in op.operands]
        if d.simulate is None:
            from fusionc.interp.interpreter import Context
            from fusionc.sim.simulator import _interpret_op
            out = _interpret_op(op, args, Context(0, [cta.values], cta.env, False))
        else:
            out = d.simulate(op, args, cta)
            if isinstance(out, Iterator):
                out = yield from _resume(out, cta, role)
        for v, x in zip(op.results, out or ()):
            cta.values[v.name] = x
        yield None   # a scheduling point after every op


def _resume(gen: Iterator, cta: CTA, role: str):
    """Drive a blocking rule: pass its Blocks to the scheduler, restore the role on resume."""
    try:
        block = next(gen)
        while True:
            yield block
            cta.stream.role = role
            block = gen.send(None)
    except StopIteration as stop:
        return stop.value


def _hang(kernel: Graph, blocks: list[Block | None]) -> None:
    waits = [b for b in blocks if b is not None]
    signals = {op.attr("name") for op in kernel.walk() if op.name == "counter_signal"}
    signals |= {op.attr("signal") for op in kernel.walk()
                if op.name in ("group_flush", "attn_units")}
    for b in waits:
        if b.counter is not None and b.counter[0] not in signals:
            raise SimulationError(f"a counter nothing signals: {b.what}, and no counter_signal "
                                  f"of the kernel adds to '{b.counter[0]}'", op=b.op.name,
                                  loc=b.op.loc, valid="a counter_signal for every counter_wait")
    first = next((b for b in waits if b.counter is not None), waits[0])
    raise SimulationError("a wait cycle: every CTA waits (a hang on the GPU): " +
                          "; ".join(b.what for b in waits if "joins" not in b.what),
                          op=first.op.name, loc=first.op.loc,
                          valid="waits only on units with lower tickets, each signalled "
                                "before its signaller waits")
