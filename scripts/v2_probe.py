"""Probe one design-v2 linear on the GPU at a chosen ring depth: time per call in a CUDA graph
over rotated buffers (``benchmarks.common.time_graph``, as ``benchmarks/gemv.py`` times it); run
under ncu for the kernel's own profile. The ring-depth rows of BENCHMARKS.md (issue 20) came
from it.

    python3 scripts/v2_probe.py N K BATCH [DTYPE] [STAGES] [ROWS]   # e.g. 4096 4096 1 f16 4 64
    python3 scripts/v2_probe.py 4096 4096 1,16,32,64,128 f16 4 64,128  # every batch x rows
    ncu --clock-control none -k regex:fusionc --launch-skip 2 --launch-count 1 \\
        python3 scripts/v2_probe.py 4096 4096 1
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fusionc as fc  # noqa: E402
from tests.passes.graphs import linear_graph  # noqa: E402


def compiled(n: int, k: int, b: int, dt: str = "f16", stages: int = 4, rows: int = 64):
    """The v2 linear ``[b, k] x [n, k]^T`` with a ring of at most ``stages`` stages and tiles of
    ``rows`` weight rows."""
    pipe = (f"partition-units{{max_batch={b}, rows={rows}}},stream-plan,insert-barriers,"
            f"smem-plan{{max_stages={stages}}}")
    return fc.compile(linear_graph(n, k, dt), max_batch=b, lowering="v2", pipeline=pipe)


def main(argv) -> None:
    """Time every (batch, rows) of comma-separated BATCH and ROWS lists."""
    argv = [str(a) for a in argv]
    for b in argv[2].split(","):
        for rows in (argv[5] if len(argv) > 5 else "64").split(","):
            probe([argv[0], argv[1], b, *argv[3:5], rows])


def probe(argv) -> None:
    import torch

    from benchmarks.common import time_graph
    n, k, b = (int(a) for a in argv[:3])
    dt = argv[3] if len(argv) > 3 else "f16"
    stages = int(argv[4]) if len(argv) > 4 else 4
    rows = int(argv[5]) if len(argv) > 5 else 64
    fn = compiled(n, k, b, dt, stages, rows)
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dt]
    sets = max(2, -(-180 * 2**20 // (n * k * tdt.itemsize)) + 1)   # past 3x the 60 MB L2
    bufs = [(torch.randn(b, k, device="cuda", dtype=tdt),
             torch.randn(n, k, device="cuda", dtype=tdt) / k ** 0.5) for _ in range(sets)]
    us = time_graph([lambda x=x, w=w: fn(x=x, w=w) for x, w in bufs]) * 1e6
    print(f"{n}x{k} {dt} B={b} stages={stages} rows={rows}: {us:.1f} us per call ({sets} sets)")


if __name__ == "__main__":
    main(sys.argv[1:])
