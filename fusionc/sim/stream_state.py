"""Simulator state of streamed persistent kernels: rings, accumulators, counters, hazards.

One :class:`StreamCTA` per CTA executes the ring, unit and counter ops (the simulator rules of
``fusionc/ir/ops/tile_stream.py`` and ``tile_units.py`` call its methods). Blocking waits are
generators that yield :class:`Block` objects; the scheduler (:mod:`fusionc.sim.grid`) resumes
them when their condition holds. Copies issued by ``ring_issue`` land later, as separate events
the scheduler interleaves with everything else.

Hazards are reported as SimulationErrors whose message starts with the hazard's name:
``stage read before its copy completed``, ``stage overwritten before release``,
``stale mbarrier parity``, ``TMA read of data written with ordinary stores and no proxy fence``
(and, from the scheduler, ``a counter nothing signals`` and ``a wait cycle``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from fusionc.errors import SimulationError
from fusionc.interp.numerics import round_to
from fusionc.stream.ring import empty_parity, full_parity, head_column, matrix_lead, stage_of
from fusionc.stream.schedule import UnitSchedule


@dataclass
class Block:
    """A wait: ``ready()`` says whether it may proceed; ``what`` describes it."""

    ready: Callable[[], bool]
    what: str
    op: object
    counter: tuple | None = None   # (name, slot) of a counter wait


@dataclass(eq=False)
class Copy:
    """An issued bulk copy that has not landed yet."""

    ring: "Ring"
    stage: int
    fill: int
    data: np.ndarray
    cta: int

    def land(self) -> None:
        self.ring.data[self.stage] = self.data
        self.ring.full_done[self.stage] += 1


@dataclass(eq=False)
class Ring:
    """One CTA's ring: stage data and the completed phases of its full / empty barriers."""

    name: str
    data: np.ndarray            # [S, rows + xrows, cols], NaN until filled
    rows: int
    full_done: list = field(default_factory=list)
    empty_done: list = field(default_factory=list)
    issued: list = field(default_factory=list)

    @property
    def stages(self) -> int:
        return self.data.shape[0]


@dataclass(frozen=True, eq=False)
class StageView:
    """The weight or activation part of one stage, as handed out by ``ring_stage``."""

    ring: Ring
    stage: int
    fill: int
    part: str     # "w" or "x"


@dataclass
class Grid:
    """State shared by the CTAs of one launch: counters, split-K partials, pending copies."""

    scheds: list                 # one UnitSchedule per phase (units region)
    counters: dict = field(default_factory=dict)
    released: dict = field(default_factory=dict)   # counter -> CTAs whose writes it publishes
    partials: dict = field(default_factory=dict)   # (output, group) -> {cta: partial}
    copies: list = field(default_factory=list)
    size: int = 0                # CTAs of the launch (counter_wait {scale = grid})


def hazard(name: str, op, detail: str, valid: str) -> SimulationError:
    return SimulationError(f"{name}: {detail}", op=op.name, loc=op.loc, valid=valid)


class StreamCTA:
    """The stream state of one CTA; ``pos[role]`` is the (j, unit) each role is at."""

    def __init__(self, cta, grid: Grid, kernel):
        self.cta, self.grid, self.kernel = cta, grid, kernel
        self.rings: dict[str, Ring] = {}
        self.pos = {"producer": (0, 0), "consumer": (0, 0)}
        self.phase = {"producer": 0, "consumer": 0}
        self.role = "consumer"
        # per role (the producer warp and the consumer warps are not ordered with each other
        # except through the ring): CTAs whose released writes the role acquired, and whether
        # it acquired generic writes since its last proxy fence
        # (the producer reads its own consumers' stores only after acquiring them, too)
        self.visible = {"producer": set(), "consumer": {cta.gid}}
        self.outputs = {op.operands[1].name for op in kernel.walk() if op.name == "group_flush"}
        self.outputs |= {op.operands[5].name for op in kernel.body if op.name == "attn_units"}
        self.proxy_dirty = {"producer": False, "consumer": False}
        from fusionc.ir.ops.tile_units import phases_of
        self.phases = phases_of(kernel)

    @property
    def sched(self) -> UnitSchedule:
        """The schedule of the phase the current role is in."""
        return self.grid.scheds[self.phase[self.role]]

    def _region(self) -> tuple:
        """The ops of the units region (phase) the current role is in."""
        return self.phases[self.phase[self.role]].regions[0]

    # -- ring --------------------------------------------------------------------------------
    def alloc(self, op, args):
        t = op.result.type
        s = t.shape[0]
        ring = Ring(op.result.name, np.full(t.shape, np.nan, np.float32), op.attr("rows"),
                    [0] * s, [0] * s, [0] * s)
        self.rings[op.result.name] = ring
        return (ring,)

    def _here(self, ring: Ring):
        j, u = self.pos[self.role]
        return j, u, stage_of(j, ring.stages), j // ring.stages

    def claim(self, op, args):
        ring = args[0]
        j, _, s, k = self._here(ring)
        if j < ring.stages:
            return ()
        p = (empty_parity(j, ring.stages) + op.attr("parity_offset")) & 1
        if p != (k - 1) & 1:
            raise hazard("stale mbarrier parity", op, f"the producer waits on empty[{s}] at "
                         f"parity {p} for the release of fill {k - 1} (parity {(k - 1) & 1})",
                         "empty_parity(j) = (j // stages - 1) & 1")
        return self._block(lambda: ring.empty_done[s] >= k, op,
                           f"CTA {self.cta.gid} producer: empty[{s}] (release of fill {k - 1})")

    def issue(self, op, args):
        ring, w, x = args
        j, u, s, k = self._here(ring)
        if ring.issued[s] > ring.empty_done[s]:
            raise hazard("stage overwritten before release", op,
                         f"CTA {self.cta.gid} copies unit {u} into stage {s} while its fill "
                         f"{ring.issued[s] - 1} is not released by the consumers",
                         "ring_claim before ring_issue")
        g, step = divmod(u, self.sched.group)
        rows, cols = ring.rows, ring.data.shape[2]
        data = np.zeros(ring.data.shape[1:], np.float32)
        wt = self._wrows(op, op.operands[1].name, g, rows, op.attr("split"), step * cols, cols,
                         tma=True)
        x0 = head_column(g, rows, op.attr("head_rows"), op.attr("head_cols"))
        xt = self._read(op, op.operands[2].name, 0, ring.data.shape[1] - rows,
                        x0 + step * cols, cols, tma=True, role="x")
        data[:wt.shape[0], :wt.shape[1]] = wt
        data[rows:rows + xt.shape[0], :xt.shape[1]] = xt
        ring.issued[s] += 1
        self.grid.copies.append(Copy(ring, s, k, data, self.cta.gid))
        return ()

    def _wrows(self, op, name, g, rows, split, c0, cols, tma=False) -> np.ndarray:
        """Weight rows of group ``g``'s tile (both halves of a paired tile), zeros past N."""
        if not split:
            return self._pad(self._read(op, name, g * rows, rows, c0, cols, tma), rows, cols)
        h = rows // 2
        gate = self._read(op, name, g * h, min(h, max(0, split - g * h)), c0, cols, tma)
        up = self._read(op, name, split + g * h, h, c0, cols, tma)
        return np.concatenate([self._pad(gate, h, cols), self._pad(up, h, cols)])

    @staticmethod
    def _pad(t, rows, cols) -> np.ndarray:
        out = np.zeros((rows, cols), np.float32)
        out[:t.shape[0], :t.shape[1]] = t
        return out

    def wait(self, op, args):
        ring = args[0]
        j, _, s, k = self._here(ring)
        p = (full_parity(j, ring.stages) + op.attr("parity_offset")) & 1
        if p != k & 1:
            raise hazard("stale mbarrier parity", op, f"the consumers wait on full[{s}] at "
                         f"parity {p} for fill {k} (parity {k & 1})",
                         "full_parity(j) = (j // stages) & 1")
        return self._block(lambda: ring.full_done[s] >= k + 1, op,
                           f"CTA {self.cta.gid} consumers: full[{s}] (fill {k})")

    def stage(self, op, args):
        ring = args[0]
        _, _, s, k = self._here(ring)
        return (StageView(ring, s, k, "w"), StageView(ring, s, k, "x"))

    def release(self, op, args):
        ring = args[0]
        _, _, s, k = self._here(ring)
        ring.empty_done[s] = max(ring.empty_done[s], k + 1)
        return ()

    def fence(self, op, args):
        self.proxy_dirty[self.role] = False
        return ()

    def view(self, v: StageView, op) -> np.ndarray:
        """The data of a stage view; the ring hazards when it is not readable now."""
        ring = v.ring
        if ring.full_done[v.stage] < v.fill + 1:
            raise hazard("stage read before its copy completed", op,
                         f"CTA {self.cta.gid} reads stage {v.stage} (fill {v.fill}) before the "
                         "copy landed", "ring_wait between ring_issue and the first read")
        if ring.issued[v.stage] > v.fill + 1 or ring.empty_done[v.stage] > v.fill:
            raise hazard("stage overwritten before release", op,
                         f"CTA {self.cta.gid} reads stage {v.stage} (fill {v.fill}) after it was "
                         "released or refilled", "ring_release after the last read")
        rows = ring.rows
        return ring.data[v.stage, :rows] if v.part == "w" else ring.data[v.stage, rows:]

    # -- global memory -----------------------------------------------------------------------
    def _read(self, op, name, r0, nr, c0, nc, tma=False, role="w") -> np.ndarray:
        """Rows ``[r0, +nr)``, columns ``[c0, +nc)`` of the 2D view of ``name`` (weight or
        activation: :func:`fusionc.stream.ring.matrix_lead`), clipped to the tensor."""
        mem = self.cta.memory
        full = mem.arrays[name]
        lead = matrix_lead(full.ndim, role)
        arr = full.reshape(int(np.prod(full.shape[:lead])), int(np.prod(full.shape[lead:])))
        rs = slice(max(r0, 0), max(min(r0 + nr, arr.shape[0]), max(r0, 0)))
        cs = slice(max(c0, 0), max(min(c0 + nc, arr.shape[1]), max(c0, 0)))
        writer = mem.writer.get(name)   # allocated at the first store only
        if name in self.outputs and arr[rs, cs].size and (
                writer is None or (writer.reshape(arr.shape)[rs, cs] < 0).any()):
            raise SimulationError(f"CTA {self.cta.gid} ({self.role}) reads %{name} before "
                                  "a flush of this launch wrote it", op=op.name, loc=op.loc,
                                  valid="a counter_wait on the flushes that write it before "
                                        "the read")
        if writer is None:
            return np.asarray(arr[rs, cs], np.float32)
        wr = writer.reshape(arr.shape)[rs, cs]
        writers = set(np.unique(wr[wr >= 0]).tolist())
        others = writers - {self.cta.gid}
        visible = self.visible[self.role]
        if writers - visible:
            who = min(writers - visible)
            raise SimulationError(f"CTA {self.cta.gid} ({self.role}) reads %{name} written by "
                                  f"CTA {who}{' (its consumers)' if who == self.cta.gid else ''}"
                                  " without acquiring it", op=op.name, loc=op.loc,
                                  valid="counter_signal after the writes, counter_wait before "
                                        "the read")
        if tma and (others or (wr == self.cta.gid).any()) and self.proxy_dirty[self.role]:
            raise hazard("TMA read of data written with ordinary stores and no proxy fence", op,
                         f"CTA {self.cta.gid} copies %{name} by TMA after acquiring writes made "
                         "with ordinary stores", "fence_proxy_async after the counter_wait")
        return np.asarray(arr[rs, cs], np.float32)

    # -- accumulators ------------------------------------------------------------------------
    def acc_alloc(self, op, args):
        return (np.zeros(op.result.type.concrete(self.cta.env), np.float32),)

    def acc_gemv(self, op, args):
        acc, x, w = args[:3]
        _, u = self.pos[self.role]
        g, step = divmod(u, self.sched.group)
        rows, cols, n, k = (op.attr(a) for a in ("rows", "cols", "n", "k"))
        if isinstance(w, StageView):
            wt, xt = self.view(w, op), self.view(x, op)
        else:
            wt = self._wrows(op, op.operands[2].name, g, rows, op.attr("split"), step * cols,
                             cols)
            x0 = head_column(g, rows, op.attr("head_rows"), op.attr("head_cols"))
            xt = self._read(op, op.operands[1].name, 0, acc.shape[0], x0 + step * cols, cols,
                            role="x")
        nc = max(0, min(cols, k - step * cols))
        m = acc.shape[0]
        xt = xt[:m, :nc].astype(np.float32)
        if len(args) == 5:   # RMSNorm of the activations (fusionc.stream.epilogue)
            from fusionc.stream.epilogue import norm_activations
            gamma = np.asarray(self.cta.memory.arrays[op.operands[3].name],
                               np.float32)[step * cols:step * cols + nc]
            xt = norm_activations(xt, np.asarray(args[4], np.float32)[:m, None], gamma,
                                  op.operands[1].type.dtype)
        acc[:m] += xt @ wt[:, :nc].astype(np.float32).T
        return ()

    def row_rms(self, op, args):
        x = self._read(op, op.operands[0].name, 0, 1 << 30, 0, 1 << 30,
                       role="x").astype(np.float32)
        ms = np.mean(x.astype(np.float64) ** 2, axis=1)
        return ((1 / np.sqrt(ms + op.attr("eps"))).astype(np.float32),)

    def flush(self, op, args):
        acc = args[0]
        sched = self.sched
        _, u = self.pos[self.role]
        g = sched.group_of(u)
        if u % sched.group != sched.group - 1 and u != sched.units(self.cta.gid).stop - 1:
            return ()
        parts = self.grid.partials.setdefault((op.operands[1].name, g), {})
        parts[self.cta.gid] = acc.copy()
        acc[...] = 0
        order = list(sched.contributors(g))
        if set(parts) == set(order):
            total = np.zeros_like(parts[order[0]])
            for c in order:
                total = total + parts[c]
            self._store(op, g, total, args)
            if op.attr("signal"):   # the writer publishes the stored tile
                key = (op.attr("signal"), g // op.attr("per"))
                self.grid.counters[key] = self.grid.counters.get(key, 0) + 1
                self.grid.released.setdefault(key, set()).update(self.visible[self.role])
        return ()

    def _store(self, op, g, total, args):
        from fusionc.stream import epilogue
        y = op.operands[1]
        arr = self.cta.memory.arrays[y.name]
        ncols = int(np.prod(arr.shape[1:]))
        gemv = next(o for o in self._region() if o.name == "acc_gemv")
        extras = [self.cta.memory.arrays[v.name] for v in op.operands[2:]]   # kernel inputs
        extras = [e.reshape(e.shape[0], -1) if e.ndim > 2 else e for e in extras]
        tile, n0 = epilogue.apply(epilogue.parse(op.attr("epilogue")), total[:arr.shape[0]],
                                  extras, g, op.attr("rows"), gemv.attr("split"), ncols)
        index = _flat_index(arr.shape, n0, n0 + tile.shape[1])
        self.cta.memory.write(y.name, index, round_to(tile, y.type.dtype), self.cta, op,
                              y.type.dtype)

    # -- counters ----------------------------------------------------------------------------
    def _slot(self, op):
        _, u = self.pos[self.role]
        base = {"const": 0, "group": self.sched.group_of(u), "unit": u,
                "step": u % self.sched.group}[op.attr("slot")]
        return (op.attr("name"), base + op.attr("index"))

    def signal(self, op, args):
        self.add(self._slot(op))
        return ()

    def add(self, key: tuple) -> None:
        """Release what the current role sees, then add 1 to counter ``key`` (name, slot)."""
        self.grid.counters[key] = self.grid.counters.get(key, 0) + 1
        self.grid.released.setdefault(key, set()).update(self.visible[self.role])

    def counter_wait(self, op, args):
        from fusionc.stream.schedule import wait_target
        key = self._slot(op)
        target = wait_target(op.attr("target"), op.attr("total"), key[1])
        if op.attr("scale") == "grid":   # one signal per CTA of the launch
            target *= self.grid.size
        yield Block(lambda: self.grid.counters.get(key, 0) >= target, f"CTA {self.cta.gid} "
                    f"waits for {key[0]}[{key[1]}] >= {target}", op, key)
        if op.attr("reset") == "wait":   # reset = exit: the kernel's last CTA zeroes the set
            self.grid.counters[key] -= target
        role = self.role   # restored by the scheduler after the wait
        self.visible[role] |= self.grid.released.get(key, set())
        self.proxy_dirty[role] = True
        return ()

    def acquire(self, op, name: str, target: int):
        """Wait (a blocking rule's generator) until counter ``name[0]`` reaches ``target``, then
        see what its signallers released (an attention phase's wait on the QKV flushes)."""
        key = (name, 0)
        yield Block(lambda: self.grid.counters.get(key, 0) >= target, f"CTA {self.cta.gid} "
                    f"waits for {name}[0] >= {target}", op, key)
        self.visible[self.role] |= self.grid.released.get(key, set())

    def global_rows(self, op, name: str) -> np.ndarray:
        """All of ``name`` ([B, N]) as this role sees it: a read of a flush's output (this
        launch's) needs the writes acquired (:meth:`_read`)."""
        shape = self.cta.memory.arrays[name].shape
        return self._read(op, name, 0, shape[0], 0, shape[1], role="x").reshape(shape)

    def _block(self, ready, op, what):
        def gen():
            if not ready():
                yield Block(ready, what, op)
            return ()
        return gen()

    def units_outside(self, op, args):   # pragma: no cover - the scheduler runs units itself
        raise SimulationError("units run by the grid scheduler only", op=op.name, loc=op.loc)


def _flat_index(shape: tuple, c0: int, c1: int) -> tuple:
    """The index of columns ``[c0, c1)`` of every row of an array ``[B, ...]`` viewed as
    ``[B, prod(rest)]``, for a range inside one row of its last dim (a head's tile)."""
    if len(shape) == 2:
        return (slice(None), slice(c0, c1))
    last = shape[-1]
    if c0 // last != (c1 - 1) // last:
        raise SimulationError(f"a tile of columns [{c0}, {c1}) straddles rows of {shape}",
                              valid="tiles inside one head (head_rows a multiple of rows)")
    lead = np.unravel_index(c0 // last, shape[1:-1])
    return (slice(None),) + tuple(int(i) for i in lead) + (slice(c0 % last, c0 % last + c1 - c0),)
