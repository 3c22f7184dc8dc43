"""Shared benchmark machinery: copy bandwidth, CUDA-graph timing over rotating buffer sets (GPU
only), and the result table (also on a machine without torch: the timing helpers need it only
when called).

Method (docs/ARCHITECTURE.md, testing tier 5): every variant is captured in one CUDA graph that calls it once
on each of N distinct buffer sets (weights, KV caches, activations) whose total is at least 3× the
60 MB L2, so no variant runs out of cache; the graph is replayed many times and the median replay
time divided by N is the time per call. The HBM floor is the bytes that must move (weights and the
valid KV read once, activations) over the device-to-device copy bandwidth measured in the same run.
"""
from __future__ import annotations

import math
import statistics

try:
    import torch
except ImportError:  # CPU machines: --compile-only and dry runs use the table and arguments only
    torch = None

L2_BYTES = 60 * 1024 * 1024


def copy_bandwidth(nbytes: int = 2 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    a = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 255)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * a.numel() / statistics.median(times)


def sets_needed(set_bytes: int) -> int:
    """Buffer sets to rotate through so that together they exceed 3× L2 (at least 2)."""
    return max(2, math.ceil(3 * L2_BYTES / max(set_bytes, 1)))


def time_graph(calls: list, warmup: int = 3, reps: int = 30) -> float:
    """Seconds per call: capture ``calls`` (zero-argument callables, one per buffer set) in one
    CUDA graph on the stream that ran them once first, replay it ``reps`` times after
    ``warmup``, median replay time / len(calls)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:  # warm up outside capture (autotuning, lazy init)
            c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    # captured on the warm-up's stream, whose lazy state (e.g. the per-stream cuBLAS handle of
    # fusionc's library path, which refuses to be created during a capture) exists by now
    with torch.cuda.graph(g, stream=stream):
        for c in calls:
            c()
    for _ in range(warmup):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times) / len(calls)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN stays NaN)."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def table(rows: list[dict], cols: list[str]) -> str:
    """A Markdown table of ``rows`` (dicts) with columns ``cols``."""
    def fmt(v):
        return f"{v:.1f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def fresh_compile(fn, mode: str | None = None):
    """``torch.compile(fn, mode=mode, dynamic=False)`` with Dynamo's caches reset first: every
    point of a sweep calls the same Python function at a new shape, and past Dynamo's recompile
    limit (8) it silently runs eager (issue 21, 2026-12-03: torch.compile measured eager's time
    from the ninth point of a sweep on)."""
    import torch
    torch._dynamo.reset()
    return torch.compile(fn, mode=mode, dynamic=False)


def measure(row: dict, sets: list[dict], eager, compiled, fusionc_fn, alt_fn=None) -> dict:
    """Fill ``row`` with the times of every variant on the same buffer sets (µs), fusionc's
    error against eager on a copy of the first set, its efficiency against ``row["floor_us"]``
    and its speed-up over the baselines. ``compiled``/``fusionc_fn`` may be None (skipped);
    ``alt_fn`` (fusionc built with other codegen options, ``--alt``) adds ``alt_us`` and
    ``alt_err``."""
    row["eager_us"] = time_graph([lambda s=s: eager(s) for s in sets]) * 1e6
    if compiled is not None:
        row["compile_us"] = time_graph([lambda s=s: compiled(s) for s in sets]) * 1e6
    if fusionc_fn is None:
        return row
    ref = eager({k: v.clone() for k, v in sets[0].items()})
    got = fusionc_fn(**{k: v.clone() for k, v in sets[0].items()})[0]
    row["err"] = f"{rel_err(got, ref):.1e}"
    row["fusionc_us"] = time_graph([lambda s=s: fusionc_fn(**s) for s in sets]) * 1e6
    row["eff_%"] = 100 * row["floor_us"] / row["fusionc_us"]
    if alt_fn is not None:
        got = alt_fn(**{k: v.clone() for k, v in sets[0].items()})[0]
        row["alt_err"] = f"{rel_err(got, ref):.1e}"
        row["alt_us"] = time_graph([lambda s=s: alt_fn(**s) for s in sets]) * 1e6
    for base in ("compile", "eager"):
        if f"{base}_us" in row:
            row[f"vs_{base}"] = f"{row[f'{base}_us'] / row['fusionc_us']:.2f}x"
    return row


def parse_args(doc: str, extra=None):
    """The flags every block benchmark takes (``extra(parser)`` adds a benchmark's own)."""
    import argparse
    ap = argparse.ArgumentParser(description=doc)
    if extra is not None:
        extra(ap)
    ap.add_argument("--quick", action="store_true", help="a few points only")
    ap.add_argument("--compile-only", action="store_true",
                    help="only compile fusionc's kernels into the cubin cache (no GPU needed)")
    ap.add_argument("--no-torch-compile", action="store_true",
                    help="skip the torch.compile baseline (its autotuning takes minutes)")
    ap.add_argument("--tune", action="store_true",
                    help="autotune fusionc's choices on the GPU first (stored, reused later); "
                         "with --compile-only, compile every candidate")
    ap.add_argument("--no-fusionc", action="store_true", help="baselines only")
    ap.add_argument("--batch", type=batch_list, help="only these batch sizes (comma-separated)")
    from fusionc.commands.compile import codegen_options_arg
    ap.add_argument("--codegen", type=codegen_options_arg, default=None, metavar="K=V,...",
                    help="fusionc's CodegenOptions, e.g. gemv_mma_batch=0,load_batch=4")
    ap.add_argument("--alt", type=codegen_options_arg, default=None, metavar="K=V,...",
                    help="also time fusionc built with these CodegenOptions (column alt_us)")
    return ap.parse_args()


def batch_list(text: str) -> tuple[int, ...]:
    """``"1,4,16"`` -> (1, 4, 16) (argparse type)."""
    import argparse
    try:
        out = tuple(int(b) for b in text.split(","))
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: batch sizes >= 1, comma-separated")
    return out


def write_csv(name: str, shard, cols: list[str], rows: list[dict]) -> None:
    """``$OUT/{name}[-shard{i}of{n}].csv`` of ``rows`` (columns ``cols``) when ``$OUT`` is set."""
    import csv
    import os
    if not os.environ.get("OUT"):
        return
    tag = f"-shard{shard[0]}of{shard[1]}" if shard else ""
    with open(os.path.join(os.environ["OUT"], f"{name}{tag}.csv"), "w") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows([[r.get(c, "") for c in cols] for r in rows])
