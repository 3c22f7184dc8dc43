"""Timeline builds of streamed kernels (``CodegenOptions(timeline=True)``; ``fusionc run
--timeline``): each CTA stores ``%globaltimer`` (ns) at fixed points of both roles, into 64-bit
slots that :mod:`fusionc.runtime.timeline` reads (``KernelSource.stamps`` names them).

Points: the CTA's entry (after the ring's setup); per phase, the producer's first weight
stages issued (before phase 0's wait for the previous kernel, PDL), its wait for an attention
phase's signals passed, its last copy issued, and
the consumers' last unit done (after their named barrier); the attention phase's wait for the
QKV flushes passed and its units done. So a fused block's time splits into
ramp (entry to the first stage's use), the attention phase, the wait, each phase and the tail.
The slots lie before the error word (which stays the last counter word): ``2·grid·n`` words
from an even word. The stamps' barriers make a timeline build slightly slower."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stamps:
    """The stamp points of one streamed kernel as its code is emitted (``on``: a timeline
    build; ``base``: the first counter word of the slots)."""

    on: bool = False
    base: int = 0
    labels: list = field(default_factory=list)

    def at(self, label: str, role: str) -> str:
        """The code storing the time into a new slot ``label``: after the consumers' barrier
        by thread 0 (``role = consumer``), by thread 0 with no barrier (``cta``: right after
        a CTA-wide one), or by the producer warp's lane 0; '' when off."""
        if not self.on:
            return ""
        self.labels.append(label)
        k = len(self.labels) - 1
        if role == "cta":
            return f"if (threadIdx.x == 0) FC_STAMP_AT({k});  // {label}\n"
        if role == "consumer":
            return (f"fc_consumer_sync<256>();  // timeline build\n"
                    f"if (threadIdx.x == 0) FC_STAMP_AT({k});  // {label}\n")
        return f"if (fc_lane == 0) FC_STAMP_AT({k});  // {label}\n"

    def macro(self, ctas: int) -> str:
        """The ``FC_STAMP_AT(slot)`` definition for ``ctas`` CTAs (the kernel's grid)."""
        if not self.on:
            return ""
        n = len(self.labels)
        return ("#define FC_STAMP_AT(slot) do { unsigned long long fc_t_; \\\n"
                '  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(fc_t_)); \\\n'
                f"  reinterpret_cast<unsigned long long*>(fc_counters + {self.base})"
                f"[blockIdx.x * {n} + (slot)] = fc_t_; }} while (0)  // {ctas} CTAs\n")


def reserve(p, n: int) -> int:
    """Make room for ``n`` slots per CTA in plan ``p``'s counters before the error word (which
    moves to the end); returns the first slot word (even: 64-bit aligned)."""
    if not n:
        return 0
    base = p.words - 1 + (p.words - 1) % 2
    p.words = base + 2 * n * p.kernel.attr("grid") + 1
    return base
