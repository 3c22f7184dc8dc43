"""Benchmark (issue 23): host time of a ``fusionc.compile`` call outside a CUDA graph. For each
graph (one-kernel attention and MLP blocks at Llama-3-8B sizes, a linear layer, attention + MLP
in one graph) and a torch op (``F.linear``): 200 back-to-back calls timed by wall clock
(synchronized before and after) against the same 200 calls captured in one CUDA graph and
replayed; host overhead per call = (eager − graph) / calls. ``submit_us`` is the wall time of
the eager loop before its closing synchronize, per call (the host's own cost while the GPU
queue has room); ``burst_us`` the same in bursts of 10 calls started on an idle GPU, so that no
launch waits for room in the driver's queue. Eager and submit are medians of 7 rounds, bursts
of 50. Run on the GPU machine:

    python3 benchmarks/host_overhead.py            # ~30 s from a warm cubin cache
    python3 benchmarks/host_overhead.py --compile-only   # fill the cubin cache (no GPU)

Prints a Markdown table (last); writes ``$OUT/host_overhead.csv`` when ``$OUT`` is set. The CPU
counterpart (Python path only, fake GPU) is ``benchmarks/host_overhead_cpu.py``.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import host_overhead_cpu as cases_mod  # noqa: E402

COLS = ["graph", "kernels", "host_ops", "eager_us", "graph_us", "host_us", "submit_us",
        "burst_us", "target_us", "ok", "err"]
BURST = 10   # calls per burst: the driver's queue never fills, so no launch waits for the GPU


def fusionc_cases(batch: int) -> dict:
    """``{name: CompiledGraph}``: the single-GPU graphs of ``host_overhead_cpu.cases``."""
    out = {}
    for name, (module, kw) in cases_mod.cases(batch).items():
        if "collectives" in name:   # needs two GPUs (benchmarks/tp2.py)
            continue
        t = time.perf_counter()
        out[name] = cases_mod.compile_case(module, kw)
        print(f"compiled {name} in {time.perf_counter() - t:.1f} s", flush=True)
    return out


def torch_args(cg, batch: int) -> dict:
    """Random torch arguments for every parameter (KV caches full, the new token last)."""
    import torch
    out = {}
    for p in cg.host.params:
        shape = p.type.concrete({"B": batch})
        if p.type.dtype.value == "i32":
            n = cases_mod.MAX_SEQ
            out[p.name] = torch.full(shape, n - 1 if p.name == "positions" else n,
                                     dtype=torch.int32, device="cuda")
        else:
            dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[
                p.type.dtype.value]
            out[p.name] = (torch.randn(shape, device="cuda") * 0.05).to(dt)
    return out


def time_calls(fn, calls: int, rounds: int = 7) -> tuple[float, float, float, float]:
    """(eager, submit, graph, burst) µs per call of ``fn()``: eager and submit the medians of
    ``rounds`` rounds of ``calls`` back-to-back calls, graph the fastest of 3 replays, burst
    the median of 50 bursts of ``BURST`` calls each started on an idle GPU."""
    import statistics

    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    eager, submit = [], []
    with torch.cuda.stream(s):
        for _ in range(3):   # warm up on the capture stream (plans, cuBLAS handle)
            fn()
        for _ in range(rounds):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            eager.append(t2 - t0)
            submit.append(t1 - t0)
    bursts = []
    with torch.cuda.stream(s):
        for _ in range(50):   # the host's own cost, the GPU's queue far from full
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(BURST):
                fn()
            bursts.append(time.perf_counter() - t0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t3 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t3)
    return (statistics.median(eager) / calls * 1e6, statistics.median(submit) / calls * 1e6,
            best / calls * 1e6, statistics.median(bursts) / BURST * 1e6)


def row(name, fn, kernels, host_ops, calls, err="") -> dict:
    eager, submit, graph, burst = time_calls(fn, calls)
    target = 15.0 + 5.0 * max(kernels + host_ops - 1, 0)
    host = eager - graph
    return dict(graph=name, kernels=kernels, host_ops=host_ops, eager_us=eager, graph_us=graph,
                host_us=host, submit_us=submit, burst_us=burst, target_us=target,
                ok=f"{'yes' if host <= target else 'NO'} / {'yes' if burst <= target else 'NO'}",
                err=err)


def planned_matches_checked(cg, args) -> str:
    """Relative difference between a checked first call's outputs and a planned call's."""
    import torch
    first = [o.clone() for o in cg(**args)]
    again = cg(**args)
    assert len(cg._plans) >= 1, "the second call did not find its plan"
    d = max(float((a.double() - b.double()).norm() / max(b.double().norm(), 1e-30))
            for a, b in zip(again, first))
    torch.cuda.synchronize()
    return f"{d:.1e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--compile-only", action="store_true",
                    help="only compile fusionc's kernels into the cubin cache (no GPU needed)")
    args = ap.parse_args()
    compiled = fusionc_cases(args.batch)
    if args.compile_only:
        for name, cg in compiled.items():
            print(name, cg.report().replace("\n", "; ") or "(library calls)")
        return
    import torch
    import torch.nn.functional as F
    print(f"{args.calls} calls per variant, batch {args.batch}, on {torch.cuda.get_device_name()}")
    rows = []
    for name, cg in compiled.items():
        a = torch_args(cg, args.batch)
        err = planned_matches_checked(cg, a)
        k = cases_mod.kernels_of(cg)
        rows.append(row(f"fusionc {name}", lambda cg=cg, a=a: cg(**a), k,
                        len(cg.host.body) - k, args.calls, err))
        print(rows[-1], flush=True)
    x = torch.randn(args.batch, cases_mod.HIDDEN, device="cuda", dtype=torch.float16)
    w = torch.randn(cases_mod.HIDDEN, cases_mod.HIDDEN, device="cuda", dtype=torch.float16)
    rows.append(row("torch F.linear", lambda: F.linear(x, w), 1, 0, args.calls))
    print(rows[-1], flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "host_overhead.csv"), "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=COLS)
            wr.writeheader()
            wr.writerows(rows)
    print(cases_mod.table(rows, COLS))


if __name__ == "__main__":
    main()
