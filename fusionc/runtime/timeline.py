"""Read the time stamps of a timeline build (``CodegenOptions(timeline=True)``): where the time
of a fused kernel goes, op by op.

Each CTA's thread 0 stored ``%globaltimer`` (ns) into one 64-bit slot per stamp point after a
``__syncthreads()`` (``KernelSource.stamps`` names them: entry, every top-level op, grid
barriers, exit). Per slot this reports, over the CTAs that reached it, the first, median and
last time in µs since the first CTA's entry, and the median time since the CTA's previous slot
(the op's own time on a typical CTA); a streamed kernel's slots in the order of their median
times (its producer and consumers stamp independently: :mod:`fusionc.codegen.stream_timeline`).
The extra barriers make a timeline build slightly slower
than the normal one; ``%globaltimer`` ticks in 32 ns steps on Hopper (PTX ISA, "Special
registers"), so sub-µs figures are coarse.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stamp:
    """One timeline slot over the CTAs of the last launch; times in µs."""

    label: str
    ctas: int        # CTAs that stored it (CTAs that exit early do not)
    first: float
    median: float
    last: float
    step: float      # median over CTAs of (this slot - the CTA's previous stored slot)


def stamps(source, counters: np.ndarray) -> list[Stamp]:
    """The slots of one kernel's last launch. ``source``: its ``KernelSource``; ``counters``:
    the launch's uint32 counters (host copy)."""
    n, ctas = len(source.stamps), source.blocks
    if not n:
        return []
    words = np.ascontiguousarray(counters[source.stamp_base:source.stamp_base + 2 * n * ctas])
    raw = words.view(np.uint64).reshape(ctas, n)
    stored = raw != 0
    if not stored[:, 0].any():   # not launched (a persistent kernel skips an empty batch)
        return []
    t0 = raw[:, 0][stored[:, 0]].min()  # ns since the epoch: subtract in integers first
    t = np.where(stored, (raw - t0).astype(np.int64), 0).astype(np.float64) / 1e3
    t[~stored] = np.nan
    last_seen = t[:, 0].copy()
    out = []
    order = list(range(n))
    if source.persistent_units:   # a streamed kernel's two roles: shown in time order
        med = [np.nanmedian(t[:, k]) if stored[:, k].any() else np.inf for k in range(n)]
        order = [0] + sorted(range(1, n), key=lambda k: med[k])
    for k in order:
        label, col = source.stamps[k], t[:, k]
        seen = ~np.isnan(col)
        if k:
            prev = np.where(seen, col - last_seen, np.nan)
            last_seen = np.where(seen, col, last_seen)
        if not seen.any():
            continue
        out.append(Stamp(label, int(seen.sum()), float(np.nanmin(col)),
                         float(np.nanmedian(col)), float(np.nanmax(col)),
                         float(np.nanmedian(prev)) if k else 0.0))
    return out


def read(fn) -> dict[str, list[Stamp]]:
    """Per kernel of a compiled module (``fusionc.compile`` with ``codegen=CodegenOptions(
    timeline=True)``), the slots of its last launch. Synchronizes the device."""
    import cupy
    cupy.cuda.Device().synchronize()
    return {name: stamps(fn.kernels[name].source, lk.counters.get())
            for name, lk in fn._loaded.items()}


def table(rows: list[Stamp]) -> str:
    """A fixed-width text table of one kernel's slots."""
    lines = [f"{'stamp':<44} {'CTAs':>5} {'first':>8} {'median':>8} {'last':>8} {'op µs':>7}"]
    lines += [f"{r.label[:44]:<44} {r.ctas:>5} {r.first:>8.2f} {r.median:>8.2f} {r.last:>8.2f} "
              f"{r.step:>7.2f}" for r in rows]
    return "\n".join(lines)
