"""Work units over a persistent grid (design v2 §1).

An op is cut into ``count`` work units, numbered in the order their data streams: a linear layer
``y = x·Wᵀ`` into tiles (row block ``g``, K chunk ``s``) numbered ``u = g·group + s``, where
``group`` units (the K chunks of one row block) accumulate into one output tile. A grid of ``G``
CTAs (``G`` = the launch's ``gridDim.x``, at most ``count``) takes contiguous, balanced unit
ranges: CTA ``c`` runs units ``[start(c), start(c + 1))`` with ``start(c) = c·count // G`` (the
"stream-K" split: every CTA gets ``count // G`` or one more unit, whatever the shape). A group
that straddles CTAs is a split-K reduction: each contributor writes its partial sum to its own
workspace slot, and the last to arrive adds the slots in CTA order (deterministic) and writes
the output; no CTA ever waits for another, so any residency works.

Slots: CTA ``c`` has two, ``2c`` for its first group and ``2c + 1`` for its last (the same group
when its range lies inside one: slot ``2c``).

The CUDA templates compute the same quantities (``templates/lib/stream.cuh.j2``:
``fc_unit_start``, ``fc_unit_cta``, the flush's slots); ``tests/sim/test_unit_schedule.py``
checks the C expressions against these on every small shape.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UnitSchedule:
    """Units ``0 .. count-1`` in groups of ``group`` consecutive units, over ``grid`` CTAs.

    Attributes:
        count: work units of the op (> 0).
        group: units per output group (row block): K chunks of one row block (> 0, divides
            nothing in particular: the last group may be shorter).
        grid: CTAs of the launch; callers pass ``min(grid, count)`` (:meth:`launch_grid`).
            In a kernel of several phases each phase takes ``min(gridDim.x, count)`` CTAs
            and the CTAs past them have no units of it (so every contributor of a split
            group runs units of it).
    """

    count: int
    group: int
    grid: int

    def __post_init__(self):
        if not (self.count > 0 and self.group > 0 and 0 < self.grid <= self.count):
            raise ValueError(f"UnitSchedule({self.count}, {self.group}, {self.grid}): need "
                             "count, group > 0 and 0 < grid <= count")

    @staticmethod
    def launch_grid(count: int, capacity: int) -> int:
        """CTAs to launch: every resident CTA, but never more CTAs than units."""
        return max(1, min(count, capacity))

    @property
    def groups(self) -> int:
        """Output groups (row blocks): ``⌈count / group⌉``."""
        return -(-self.count // self.group)

    def start(self, cta: int) -> int:
        """First unit of CTA ``cta`` (``start(grid) == count``)."""
        return cta * self.count // self.grid

    def units(self, cta: int) -> range:
        """The units CTA ``cta`` runs, in order (none past the grid: a larger phase's CTAs)."""
        if cta >= self.grid:
            return range(self.count, self.count)
        return range(self.start(cta), self.start(cta + 1))

    def cta_of(self, unit: int) -> int:
        """The CTA that runs ``unit``: the largest c with start(c) <= unit."""
        return ((unit + 1) * self.grid - 1) // self.count

    def group_of(self, unit: int) -> int:
        """The group (row block) of ``unit``."""
        return unit // self.group

    def group_units(self, g: int) -> range:
        """The units of group ``g`` (the last group may be shorter)."""
        return range(g * self.group, min(self.count, (g + 1) * self.group))

    def contributors(self, g: int) -> range:
        """CTAs that run units of group ``g``, in the order their partials are added."""
        r = self.group_units(g)
        return range(self.cta_of(r.start), self.cta_of(r.stop - 1) + 1)

    def slot(self, cta: int, g: int) -> int:
        """Workspace slot of CTA ``cta``'s partial sum of group ``g``."""
        first = self.group_of(self.start(cta))
        return 2 * cta + (0 if g == first else 1)


def wait_target(target: int, total: int, slot: int) -> int:
    """Signals counter slot ``slot`` of a ``counter_wait {target, total}`` waits for: ``target``,
    or, with ``total = T > 0`` signals over all slots, what is left of T at the last slot
    (``max(0, min(target, T - target·slot))``: a phase reading K chunks of ``target`` producer groups
    each, the last chunk shorter). The templates emit :func:`wait_target_c`."""
    return target if not total else max(0, min(target, total - target * slot))


def wait_target_c(target: int, total: int, slot: str) -> str:
    """:func:`wait_target` as a C expression of the slot expression ``slot``."""
    return f"{target}u" if not total else \
        f"(unsigned)max(0, min({target}, {total} - {target} * ({slot})))"
