"""Per-kernel timeline of one fusionc callable replayed in a CUDA graph (GPU machine only).

The device machines have no Nsight Systems; PyTorch's profiler (CUPTI) records every kernel of
the process, also those fusionc launches through the driver and those inside a graph replay.
This prints, for the median replay, each kernel's duration, its start and end offsets from its
call's first kernel and its share of the critical path (medians over the calls), then the span
per call. Under programmatic dependent launch a kernel starts before its predecessor ends, so
durations overlap and sum to more than the span; the shares sum to it.

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
    from benchmarks import mla
    args = mla.parse(argv)
    for layer, b, k in mla.points(args):
        m = mla.LAYERS[layer]
        sets = mla.buffer_sets(m, b, k)
        yield f"{layer} b{b} kv{k}", mla.fusionc_mla(m, b, k), sets
        if args.alt:
            yield f"{layer} b{b} kv{k} --alt {args.alt}", \
                mla.fusionc_mla(m, b, k, chain=args.alt == "chain"), sets


CASES = {"mla": mla_case}


def kernels_of(trace: dict) -> list[tuple[float, float, str]]:
    """(start µs, duration µs, name) of every GPU kernel in a Chrome trace, by start (ties in
    the trace's order)."""
    ev = [(e["ts"], e["dur"], e["name"]) for e in trace.get("traceEvents", [])
          if e.get("cat") == "kernel" and "ts" in e and "dur" in e]
    return sorted(ev, key=lambda e: e[0])


def replays(kernels: list, per_replay: int) -> list[list]:
    """``kernels`` cut into consecutive replays of ``per_replay`` kernels."""
    return [kernels[i:i + per_replay] for i in range(0, len(kernels) - per_replay + 1, per_replay)]


def timeline(fn, sets: list[dict], reps: int) -> list[tuple[float, float, float, str]]:
    """(offset, duration, share, name) of each kernel of the median-span replay of one graph
    that calls ``fn`` once per buffer set; a kernel's share of the critical path is how far its
    end passes the latest end of the kernels before it in the replay (the previous call's
    included: under programmatic dependent launch the next call's first kernel overlaps it)."""
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
    runs = replays(ks, per) if per else [ks]
    span = lambda r: r[-1][0] + r[-1][1] - r[0][0]  # noqa: E731
    return with_shares(sorted(runs, key=span)[len(runs) // 2])


def with_shares(run: list) -> list[tuple[float, float, float, str]]:
    """(offset from the first start, duration, share, name) of the kernels (start, duration,
    name) of one replay: a kernel's share is how far its end passes the latest end before it
    (the first kernel's: its duration)."""
    t0, out, end = run[0][0], [], run[0][0]
    for ts, dur, name in run:
        out.append((ts - t0, dur, max(0.0, ts + dur - end) if out else dur, name))
        end = max(end, ts + dur)
    return out


def table(tl: list, calls: int) -> str:
    """The Markdown table of :func:`timeline`'s kernels for ``calls`` calls: per kernel of a
    call, medians over the calls of duration, start and end (from the call's first kernel) and
    share, then the span per call."""
    per_call = len(tl) // calls
    lines = ["| kernel | median µs | start µs | end µs | share µs |", "|---|---|---|---|---|"]
    for j in range(per_call):
        col = [tl[i * per_call + j] for i in range(calls)]
        call0 = [tl[i * per_call][0] for i in range(calls)]   # each call's first start
        med = lambda xs: statistics.median(list(xs))  # noqa: E731
        lines.append(f"| {col[0][3]} | {med(c[1] for c in col):.2f} | "
                     f"{med(c[0] - t for c, t in zip(col, call0)):.2f} | "
                     f"{med(c[0] + c[1] - t for c, t in zip(col, call0)):.2f} | "
                     f"{med(c[2] for c in col):.2f} |")
    span = tl[-1][0] + tl[-1][1]
    lines.append(f"| span per call | | | | {span / calls:.2f} ({len(tl)} kernels, {calls} calls) |")
    return "\n".join(lines)


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
        if fn is None:
            print(f"\n{label}: fusionc cannot compile it (above)")
            continue
        print(f"\n{label}:\n" + table(timeline(fn, sets, reps), max(1, len(sets))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
