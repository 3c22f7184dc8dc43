"""Per-kernel timeline of one fusionc callable replayed in a CUDA graph (GPU machine only).

The device machines have no Nsight Systems; PyTorch's profiler (CUPTI) records every kernel of
the process, also those fusionc launches through the driver and those inside a graph replay.
This prints, for the median replay, each kernel's duration and its start and end offsets from
its call's first kernel (medians over the calls), then the replay's span. Under programmatic
dependent launch a kernel starts before its predecessor ends, so durations overlap; the end
minus the previous kernel's end is each kernel's share of the critical path.

    python3 benchmarks/timeline.py mla --layer V2-Lite --batch 1 --kv 1024 [--reps 20]

One buffer set is rotated with ``sets_needed`` others so that the weights come from HBM, as in
the benchmark. Only ``mla`` is wired up so far (its ``fusionc_mla`` and ``make_set``).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]


def mla_case(argv: list[str]):
    """(label, fusionc callable, buffer sets) of every point ``benchmarks/mla.py argv`` names
    (and of its ``--alt`` build)."""
    from benchmarks import common, mla
    args = mla.parse(argv)
    for layer, b, k in mla.points(args):
        m = mla.LAYERS[layer]
        sets = [mla.make_set(m, b, k) for _ in range(common.sets_needed(mla.floor_bytes(m, b, k)))]
        yield f"{layer} b{b} kv{k}", mla.fusionc_mla(m, b, k), sets
        if args.alt:
            yield f"{layer} b{b} kv{k} --alt {args.alt}", \
                mla.fusionc_mla(m, b, k, chain=args.alt == "chain"), sets


CASES = {"mla": mla_case}


def kernels_of(trace: dict) -> list[tuple[float, float, str]]:
    """(start µs, duration µs, name) of every GPU kernel in a Chrome trace, by start."""
    ev = [(e["ts"], e["dur"], e["name"]) for e in trace.get("traceEvents", [])
          if e.get("cat") == "kernel" and "ts" in e and "dur" in e]
    return sorted(ev)


def replays(kernels: list, per_replay: int) -> list[list]:
    """``kernels`` cut into consecutive replays of ``per_replay`` kernels."""
    return [kernels[i:i + per_replay] for i in range(0, len(kernels) - per_replay + 1, per_replay)]


def timeline(fn, sets: list[dict], reps: int) -> list[tuple[float, float, float, str]]:
    """(offset, duration, gap before, name) of each kernel of the median-span replay of one
    graph that calls ``fn`` once per buffer set."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks import common
    calls = [lambda s=s: fn(**s) for s in sets]
    common.time_graph(calls, warmup=3, reps=3)          # warm: compile, lazy init, one capture
    g, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.graph(g, stream=stream):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            ks = kernels_of(json.load(f))
    per = len(ks) // reps // len(sets) * len(sets)
    runs = replays(ks, per) or [ks]
    span = lambda r: r[-1][0] + r[-1][1] - r[0][0]  # noqa: E731
    med = sorted(runs, key=span)[len(runs) // 2]
    t0, out, end = med[0][0], [], med[0][0]
    for ts, dur, name in med:
        out.append((ts - t0, dur, max(0.0, ts - end), name))
        end = max(end, ts + dur)
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in CASES:
        print(f"usage: timeline.py {{{','.join(CASES)}}} [the benchmark's args] [--reps N]")
        return 2
    reps = 20
    if "--reps" in argv:
        i = argv.index("--reps")
        reps = int(argv[i + 1])
        del argv[i:i + 2]
    for label, fn, sets in CASES[argv[0]](argv[1:]):
        tl = timeline(fn, sets, reps)
        n = max(1, len(sets))
        span = tl[-1][0] + tl[-1][1]
        print(f"\n{label}: {len(tl)} kernels for {n} calls, span {span:.1f} µs "
              f"({span / n:.1f} µs per call), gaps {sum(g for *_, g, _ in tl) / n:.1f} µs "
              f"per call, kernels {sum(d for _, d, *_ in tl) / n:.1f} µs per call")
        per_call = len(tl) // n
        print("| kernel | median µs | start µs | end µs | end − previous end µs |\n"
              "|---|---|---|---|---|")
        prev = 0.0
        for j in range(per_call):
            col = [tl[i * per_call + j] for i in range(n)]
            call0 = [tl[i * per_call][0] for i in range(n)]   # each call's first start
            start = statistics.median(c[0] - t for c, t in zip(col, call0))
            end = statistics.median(c[0] + c[1] - t for c, t in zip(col, call0))
            print(f"| {col[0][3]} | {statistics.median(c[1] for c in col):.2f} | "
                  f"{start:.2f} | {end:.2f} | {end - prev:.2f} |")
            prev = end
    return 0


if __name__ == "__main__":
    sys.exit(main())
