"""Where a CTA-wide barrier (``__syncthreads()``) is needed between two ops.

Every op's code is block-cooperative: thread i touches some elements of its inputs and outputs,
in a mapping private to the op. So an op that reads memory written since the last barrier
(read-after-write), or writes memory read or written since then (write-after-read,
write-after-write — also when a dead value's bytes are reused), must wait for a barrier first.
Memory is tracked as byte ranges of shared memory and whole global tensors.
A cluster barrier (all threads of all CTAs) clears the state like a CTA barrier.
"""
from __future__ import annotations

from dataclasses import dataclass, field

Region = tuple  # ("smem", lo, hi) or ("global", name)


def _overlap(a: Region, b: Region) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "global":
        return a[1] == b[1]
    return a[1] < b[2] and b[1] < a[2]


@dataclass
class HazardTracker:
    """Reads and writes since the last barrier."""

    reads: list[Region] = field(default_factory=list)
    writes: list[Region] = field(default_factory=list)

    def needs_barrier(self, reads: list[Region], writes: list[Region]) -> bool:
        """Whether an op with these effects must be preceded by a CTA barrier."""
        raw = any(_overlap(r, w) for r in reads for w in self.writes)
        war = any(_overlap(w, x) for w in writes for x in self.reads + self.writes)
        return raw or war

    def record(self, reads: list[Region], writes: list[Region]) -> None:
        self.reads.extend(reads)
        self.writes.extend(writes)

    def clear(self) -> None:
        """A barrier was emitted."""
        self.reads.clear()
        self.writes.clear()

    def copy(self) -> "HazardTracker":
        return HazardTracker(list(self.reads), list(self.writes))

    def merge(self, other: "HazardTracker") -> None:
        """After a branch: whatever either path may have left unsynchronized."""
        self.reads.extend(r for r in other.reads if r not in self.reads)
        self.writes.extend(w for w in other.writes if w not in self.writes)
