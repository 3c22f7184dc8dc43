"""Where the time of the fused MLA kernel goes: build it with CodegenOptions(timeline=True)
(thread 0 of every CTA stores %globaltimer at entry, at each grid_barrier arrival and release,
and at exit), launch it a few times, then print the last launch per event: first and last CTA,
in µs from the first CTA's entry.

    python3 scripts/mla_timeline.py --batch 1 --kv 4096 [--load-batch 4]
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]


def run(batch: int, kv: int, load_batch: int = 1, launches: int = 5) -> None:
    """Launch the timeline build ``launches`` times; print the last launch's phases."""
    import cupy
    import numpy as np

    import deepseek_v2_lite
    import fusionc as fc
    from fusionc.codegen import CodegenOptions
    from fusionc.commands.compile import random_inputs
    from fusionc.runtime.transfer import upload
    m = deepseek_v2_lite.build(max_seq=kv)
    fn = fc.compile(m, max_batch=batch, kv_len=kv,
                    codegen=CodegenOptions(timeline=True, load_batch=load_batch))
    g = m["attention"]
    ins = random_inputs(g, batch, np.random.default_rng(0))
    ins["seq_lens"] = np.full(batch, kv, np.int32)
    ins["positions"] = np.full(batch, kv - 1, np.int32)
    dev = {p.name: upload(ins[p.name], p.type.dtype) for p in g.params}
    for _ in range(launches):
        fn(**dev)
    cupy.cuda.Device().synchronize()
    (lk,) = fn._loaded.values()
    src = next(iter(fn.kernels.values())).source
    ctas = src.grid * src.cluster
    words = lk.counters[-ctas * 32:].get()
    stamps = words.view(np.uint64).reshape(ctas, 16).astype(np.int64)
    summarize(stamps, f"B={batch} KV={kv}: {fn.report().splitlines()[0]}")


def summarize(stamps, title: str) -> None:
    """Per slot: CTAs that stamped it, first and last time in µs from the first entry."""
    import numpy as np
    t0 = stamps[:, 0].min()
    print(title)
    print(f"{'event':>16} {'first µs':>9} {'last µs':>9}")
    for slot in range(16):
        col = stamps[:, slot]
        if not np.all(col > 0):
            continue
        name = {0: "entry", 15: "exit"}.get(
            slot, f"barrier {(slot + 1) // 2} {'arrive' if slot % 2 else 'leave'}")
        print(f"{name:>16} {(col.min() - t0) / 1e3:>9.2f} {(col.max() - t0) / 1e3:>9.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kv", type=int, default=4096)
    ap.add_argument("--load-batch", type=int, default=1,
                    help="CodegenOptions.load_batch: 16-byte tile loads in flight per thread")
    a = ap.parse_args()
    run(a.batch, a.kv, a.load_batch)
