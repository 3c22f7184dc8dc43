"""Stored facts about the NVIDIA H200 (SXM), measured on the project's machines (2026-11-29)
unless marked as a datasheet lead.

These drive the choice of cluster size and mapping without a GPU; autotuning on the device
refines them (issue 8).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Device:
    """Facts the cost model needs. Bandwidths in bytes/s, times in seconds."""

    name: str
    sms: int
    smem_per_block: int          # opt-in dynamic shared memory per CTA, bytes
    smem_per_sm: int             # shared memory of one SM usable by CTAs, bytes
    l2_bytes: int
    copy_bandwidth: float        # device-to-device copy, read + write
    # clusters resident at once with one CTA per SM (occupancy query), by cluster size
    resident_clusters: dict[int, int] = field(default_factory=dict)
    # one all-read cluster all-reduce round (two barriers), by cluster size and payload bytes
    collective_s: dict[int, dict[int, float]] = field(default_factory=dict)
    launch_s: float = 2.5e-6     # launch + ramp of one kernel in a CUDA graph (estimate)
    load_latency_s: float = 2.0e-6   # global load latency under full load (fit to the sweep)
    cta_l2_bandwidth: float = 100e9   # one CTA reading partials from L2, bytes/s (estimate)
    grid_reduce_s: float = 2e-6      # fence + atomic arrival + tail latency (estimate)
    smem_reserved_per_block: int = 1024  # the hardware's own shared memory per CTA (sm_90)
    # lowering v2's paths, us by batch rows (max_batch = the batch): {rows: ((fused, wide,
    # library) per measured graph)}; see v2_path
    v2_paths_us: dict[int, tuple[tuple[float, float, float], ...]] = field(default_factory=dict)

    def resident(self, grid: int, size: int, blocks: int = 1) -> bool:
        """Whether ``grid`` clusters of ``size`` CTAs are all resident at once, what kernels whose
        CTAs wait for each other need. ``blocks``: CTAs per SM that the kernel's shared memory,
        threads and ``__launch_bounds__`` registers allow; the one-CTA-per-SM placement
        (``resident_clusters``, an occupancy query) repeated ``blocks`` times is a lower bound
        (the load-time query ``cuOccupancyMaxActiveClusters`` confirms it:
        ``fusionc.runtime.launch``)."""
        return grid <= max(1, blocks) * self.resident_clusters.get(size, 0)

    def v2_path(self, rows: int) -> str | None:
        """Lowering v2's measured-fastest path at ``rows`` batch rows: ``"fused"`` (fused
        kernels of 64-row weight tiles), ``"wide"`` (128-row tiles, tensor cores only) or
        ``"library"`` (cuBLAS GEMMs), by the smallest sum over the measured graphs at the
        smallest measured batch of at least ``rows`` (a batch bucket runs at its largest batch:
        33-63 rows take the 64-row figures); None past the table or without one (the fused
        bucket decides there). The table holds fp16 MLPs and decides for every graph; lone
        linears favour cuBLAS more (``benchmarks/gemv.py``: cuBLAS faster at some of 1 and 16
        rows on three of four shapes, by 0.2-3.2 us, and from 32 rows on three; BENCHMARKS.md,
        issue 21 step 3b). InputError for a batch that is no positive int."""
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
            from fusionc.errors import InputError
            raise InputError(f"rows = {rows!r}", op="v2_path", valid="a batch of >= 1 rows")
        at = [r for r in sorted(self.v2_paths_us) if r >= rows]
        if not at:
            return None
        sums = [sum(t[i] for t in self.v2_paths_us[at[0]]) for i in range(3)]
        return ("fused", "wide", "library")[sums.index(min(sums))]

    def collective_time(self, size: int, payload: int) -> float:
        """Seconds for one collective over ``payload`` bytes per CTA (log-linear interpolation
        of the anchor table; 0 for a cluster of one)."""
        if size <= 1:
            return 0.0
        table = sorted(self.collective_s[size].items())
        for (b0, t0), (b1, t1) in zip(table, table[1:]):
            if payload <= b1:
                f = max(0.0, (payload - b0) / (b1 - b0))
                return t0 + f * (t1 - t0)
        (b0, t0), (b1, t1) = table[-2], table[-1]
        return t1 + (payload - b1) * (t1 - t0) / (b1 - b0)


H200 = Device(
    name="NVIDIA H200",
    sms=132,
    smem_per_block=227 * 1024,
    smem_per_sm=228 * 1024,
    l2_bytes=60 * 1024 * 1024,
    copy_bandwidth=4.2e12,
    resident_clusters={1: 132, 2: 66, 4: 30, 8: 15, 16: 7},
    collective_s={
        2: {256: 0.76e-6, 1024: 0.91e-6, 4096: 1.84e-6, 16384: 5.6e-6},
        4: {256: 1.19e-6, 1024: 1.56e-6, 4096: 3.90e-6, 16384: 13.2e-6},
        8: {256: 2.04e-6, 1024: 2.91e-6, 4096: 8.09e-6, 16384: 28.8e-6},
        16: {256: 3.73e-6, 1024: 5.52e-6, 4096: 16.1e-6, 16384: 58.8e-6},
    },
    # The Llama-2-7B and Llama-3-8B MLP blocks, fp16, 2026-12-03, `python3 benchmarks/mlp_block.py`
    # (BENCHMARKS.md, issue 21 step 3c): fused and wide at 1-16 rows, wide and library at 32-64
    # from `--compare-wide` (one run, 8 models); library at 1-16 and fused at 32-128 from
    # `--compare-library` (step 3b, run 3); wide and library at 128 from `--compare-wide
    # --batch 1,16,32,64,128 --models Llama-2-7B,Llama-3-8B` (step 3c, run 1)
    v2_paths_us={
        1: ((74.7, 74.6, 84.9), (94.1, 93.1, 102.3)),
        4: ((76.4, 76.8, 85.8), (95.3, 93.7, 100.8)),
        8: ((78.8, 77.4, 86.5), (95.5, 94.7, 105.2)),
        16: ((81.6, 79.2, 87.6), (100.6, 96.0, 105.5)),
        32: ((89.0, 84.9, 88.5), (107.9, 101.7, 107.9)),
        64: ((107.9, 101.5, 95.9), (136.2, 118.4, 116.1)),
        128: ((180.8, 164.8, 105.8), (221.8, 198.1, 133.1)),
    },
)
