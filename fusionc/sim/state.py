"""Simulator state: CTAs, their shared-memory buffers, and global memory.

Visibility rules (the execution model codegen must honour):
- A CTA's shared-memory buffer is read by peers only through a collective. Within one *barrier
  phase* (the span between two ``cluster_barrier`` ops) a buffer may be written by its owner or
  read by peers, never both: a write must be followed by a barrier before peers read, and a peer
  read by a barrier before the owner overwrites it or exits.
- Global memory written by one CTA is not visible to another CTA of the same launch (there is no
  grid-wide ordering); two CTAs storing the same element is a race, except through
  ``grid_reduce``, which the hardware path performs in a fixed order after the grid.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fusionc.errors import SimulationError
from fusionc.interp.numerics import round_to
from fusionc.ir.nodes import Op
from fusionc.ir.types import DType


class CTAExit(Exception):
    """Raised inside a CTA's program by ``exit()``."""


@dataclass
class SmemBuffer:
    """One shared-memory buffer of one CTA, with the phases of its last write and peer read."""

    name: str
    dtype: DType
    data: np.ndarray
    written_phase: int | None = None
    peer_read_phase: int | None = None
    peer_read_by: Op | None = None

    def store(self, value: np.ndarray, phase: int, op: Op, rank: int) -> None:
        if self.peer_read_phase == phase:
            raise SimulationError(
                f"CTA {rank} overwrites %{self.name} while peers may still read it "
                f"(read by '{self.peer_read_by.name}' at {self.peer_read_by.loc}, "
                "same barrier phase)", op=op.name, loc=op.loc,
                valid="a cluster_barrier() between the peers' read and the new write")
        self.data = round_to(np.broadcast_to(value, self.data.shape), self.dtype)
        self.written_phase = phase


@dataclass
class CTA:
    """One thread block: its coordinates, SSA values, shared memory and barrier phase."""

    cluster: int
    rank: int
    size: int  # cluster size C
    env: dict[str, int]
    memory: "GlobalMemory"
    values: dict[str, np.ndarray] = field(default_factory=dict)
    smem: dict[str, SmemBuffer] = field(default_factory=dict)
    phase: int = 0
    exited: bool = False

    @property
    def gid(self) -> int:
        """Linear CTA id in the grid."""
        return self.cluster * self.size + self.rank


class GlobalMemory:
    """Kernel parameters in device memory, with per-element writer tracking for races."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays
        # per-element writer CTA id (-1: none), allocated at an array's first store: most
        # parameters (weights) are only read, and a writer map of their size costs seconds
        self.writer: dict[str, np.ndarray] = {}
        self.reductions: dict[str, list] = {}

    def read(self, name: str, index: tuple, cta: CTA, op: Op, flat: bool = False) -> np.ndarray:
        """Elements ``index`` of parameter ``name`` as seen by ``cta``; SimulationError if another
        CTA of this launch wrote them. ``flat``: index the array as ``[-1, last dim]``.
        """
        arrays, writer = self.arrays[name], self.writer.get(name)
        if writer is None:   # never stored to in this launch
            return (arrays.reshape(-1, arrays.shape[-1]) if flat else arrays)[index]
        if flat:
            arrays, writer = (a.reshape(-1, a.shape[-1]) for a in (arrays, writer))
        w = writer[index]
        if np.any((w >= 0) & (w != cta.gid)):
            other = int(w[(w >= 0) & (w != cta.gid)].flat[0])
            raise SimulationError(
                f"CTA {cta.gid} reads %{name} where CTA {other} wrote in the same launch "
                "(no ordering between CTAs of a grid)", op=op.name, loc=op.loc,
                valid="pass the value through a collective, or split the kernel")
        return arrays[index]

    def write(self, name: str, index: tuple, value: np.ndarray, cta: CTA, op: Op,
              dtype: DType) -> None:
        """Store ``value`` (rounded to ``dtype``) at ``index`` of ``name``; SimulationError if
        another CTA wrote the same elements.
        """
        if name not in self.writer:
            self.writer[name] = np.full(self.arrays[name].shape, -1, np.int32)
        w = self.writer[name][index]
        if np.any((w >= 0) & (w != cta.gid)):
            other = int(w[(w >= 0) & (w != cta.gid)].flat[0])
            raise SimulationError(
                f"CTAs {other} and {cta.gid} both store to the same elements of %{name}",
                op=op.name, loc=op.loc, valid="disjoint stores, or grid_reduce")
        self.arrays[name][index] = round_to(value, dtype)
        self.writer[name][index] = cta.gid

    def grid_sync(self) -> None:
        """A grid_barrier: every store so far is visible to every CTA (the race marks clear)."""
        for w in self.writer.values():
            w.fill(-1)

    def add_reduction(self, name: str, index: tuple, value: np.ndarray, cta: CTA,
                      init: np.ndarray | None = None) -> None:
        """Record a grid_reduce contribution of ``cta`` (and its init), applied by
        finish_reductions.
        """
        self.reductions.setdefault(name, []).append(
            (cta.gid, index, value.astype(np.float32),
             None if init is None else np.asarray(init, np.float32)))

    def finish_reductions(self, dtypes: dict[str, DType]) -> None:
        """Apply grid_reduce contributions: each element starts from its ``init`` (if given) and
        adds the contributions in fp32 in CTA order, then is rounded once."""
        for name, parts in self.reductions.items():
            arr = self.arrays[name]
            acc = np.zeros(arr.shape, np.float32)
            hit = np.zeros(arr.shape, bool)
            inited = np.zeros(arr.shape, bool)
            parts = sorted(parts, key=lambda p: p[0])
            for gid, index, _, init in parts:
                if init is not None:
                    fresh = ~inited[index]
                    same = np.where(fresh, True, (acc[index] == init) |
                                    (np.isnan(acc[index]) & np.isnan(init)))
                    if not np.all(same):
                        raise SimulationError(
                            f"CTA {gid} passes grid_reduce an init for %{name} that differs "
                            "from another contributor's (the GPU adds whichever arrives last)",
                            op="grid_reduce", valid="the same init on every contributing CTA")
                    acc[index] = np.where(fresh, init, acc[index])
                    inited[index] = True
            for _, index, value, _ in parts:
                acc[index] = acc[index] + value
                hit[index] = True
            arr[hit] = round_to(acc[hit], dtypes[name])
        self.reductions.clear()
