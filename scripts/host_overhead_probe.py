"""Where the CPU time of a planned ``fusionc.compile`` call goes (issue 23), on the GPU machine:
per graph of ``benchmarks/host_overhead.py`` the whole call (200 in a row, bursts of 10 on an
idle GPU, 1000 in a row), the argument signature, the plan lookup and the driver launch per
kernel; ``torch.empty`` against a pooled output; ``F.linear``. Medians; prints a Markdown table.

    python3 scripts/host_overhead_probe.py   # after benchmarks/host_overhead.py --compile-only
"""
import os
import statistics
import sys
import time
sys.path.insert(0, os.getcwd())
import torch
from benchmarks import host_overhead as ho
from fusionc.runtime import arrays

def sub(fn, n=200, rounds=9):
    """median µs per call of n back-to-back calls (submission only; sync outside the timing)"""
    r = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        a = time.perf_counter()
        for _ in range(n):
            fn()
        r.append(time.perf_counter() - a)
    torch.cuda.synchronize()
    return statistics.median(r) / n * 1e6

rows = []
def rec(case, what, us):
    rows.append((case, what, us)); print(f"{case:10s} {what:40s} {us:7.2f}", flush=True)

dev = torch.device("cuda", 0)
rec("torch", "torch.empty((1,4096))", sub(lambda: torch.empty((1, 4096), dtype=torch.float16, device=dev), 2000))
w = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
xx = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
import torch.nn.functional as F
rec("torch", "F.linear submit", sub(lambda: F.linear(xx, w)))
compiled = ho.fusionc_cases(1)
for name, cg in compiled.items():
    a = ho.torch_args(cg, 1)
    cg(**a); cg(**a); torch.cuda.synchronize()
    short = name.split()[0]
    rec(short, "whole planned call (kwargs)", sub(lambda: cg(**a)))
    pos = [a[n] for n in cg._names]
    rec(short, "whole planned call (positional)", sub(lambda: cg(*pos)))
    vals = cg._ordered((), a)
    rec(short, f"signature ({len(vals)} args)", sub(lambda: arrays.signature(vals, 0), 2000))
    key = arrays.signature(vals, 0)[0]
    rec(short, "plan lookup", sub(lambda: cg._plans.get(key), 2000))
    rec(short, "whole planned call, bursts of 10", sub(lambda: cg(**a), 10, 60))
    rec(short, "whole planned call, 1000 in a row", sub(lambda: cg(**a), 1000, 3))
    plan = next(iter(cg._plans.values()))
    for kname, lk in cg._loaded.items():
        pack = list(lk._packs.values())[0]
        stream = torch.cuda.current_stream().cuda_stream
        cfg = lk._configs.get(stream) or lk._config(stream)
        fn, pa = lk.function, pack.address
        rec(short, f"launch {kname[-10:]}, bursts of 10", sub(lambda: lk._launch(cfg, fn, pa, 0), 10, 60))
from fusionc.ir.nodes import Value
from fusionc.ir.types import TensorType, DType
al = arrays.allocator(Value("y", TensorType(DType.f16, (1, 4096))), {}, True, 0)
st = torch.cuda.current_stream().cuda_stream
rec("pool", "pooled output (1, 4096) f16", sub(lambda: al(st), 2000))
rec("pool", "plain output (capture path)", sub(lambda: al(None), 2000))
print("| case | what | µs |\n|---|---|---|")
for c, w_, u in rows:
    print(f"| {c} | {w_} | {u:.2f} |")
