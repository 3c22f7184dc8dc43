"""Benchmark (issue 20): one linear layer y = x·Wᵀ (torch.nn.Linear layout, W [N, K]) at decode
batch sizes — fusionc vs torch ``F.linear`` (cuBLAS), each in a CUDA graph, vs the floor.

On the GPU machine (after ``--compile-only`` on a CPU machine into ``FUSIONC_CACHE_DIR``):

    python3 benchmarks/gemv.py --quick          # 12 headline points, fp16 (< 2 min)
    python3 benchmarks/gemv.py                  # 12 shapes x batch 1..256 x fp16/bf16
    python3 benchmarks/gemv.py --shard 0/3      # every 3rd point from the 1st (also 1/3, 2/3)
    python3 benchmarks/gemv.py --bias --dtypes bf16 --batches 1,4 --shapes 4608x3584
    FUSIONC_CACHE_DIR=.fcache python benchmarks/gemv.py --compile-only   # CPU: fill the cache
    python benchmarks/gemv.py --no-torch        # CPU dry run: points, floors, CSV, no timing

Method (benchmarks/common.py): per point, distinct (x, W) buffer sets totalling more than 3x the
60 MB L2 (ceil(3·L2 / weight bytes) + 1 sets), one CUDA graph with one call per set (fusionc's
callable; separately F.linear), replayed 30 times after warm-up: time per call = median replay
time / sets. Inputs are random normal (W scaled by 1/sqrt(K)); fusionc's output (poisoned with
NaN first) is checked once per point against float64 ``x @ Wᵀ`` (norm-wise relative error, FAIL
above 1e-2).

Floor (DESIGN v2): max(bytes / copy bandwidth, FLOPs / 790 TFLOP/s), bytes = N·K·2 (W) +
B·K·2 (x) + B·N·2 (y) (+ N·2 bias), FLOPs = 2·B·N·K, the device-to-device copy bandwidth (read
+ write) measured in the same run. Target: floor / 0.95 + 2 µs; ``met`` is ok when fusionc is
at or under it, MISS otherwise, FAIL when its result is wrong. One CSV row per point goes to
``$OUT/gemv.csv`` (``gemv-shard{i}of{n}.csv`` with ``--shard``; or ``--csv PATH``) as the run
goes. ``path`` says what fusionc ran: its own kernels, or cuBLAS (its library lowering).
"""
from __future__ import annotations  # graphs take their input types in the decorator (below)

import argparse
import csv
import math
import os
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # CPU machines: --compile-only and --no-torch need no torch
    torch = F = None

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402

# (N, K, where the shape comes from). Llama-2-7B: hidden 4096, 32 heads, intermediate 11008;
# Llama-3-8B (and Mistral-7B): hidden 4096, 8 KV heads, intermediate 14336; Llama-2/3-70B:
# hidden 8192, 8 KV heads of 128; Qwen2.5-7B: hidden 3584, 28 heads / 4 KV heads of 128,
# intermediate 18944 (its QKV has a bias: --bias); Llama-3.2-3B: hidden 3072, intermediate 8192.
SHAPES = [
    (4096, 4096, "Llama-2/3-7/8B q/o proj"),
    (6144, 4096, "Llama-3-8B fused qkv"),
    (12288, 4096, "Llama-2-7B fused qkv"),
    (22016, 4096, "Llama-2-7B fused gate/up"),
    (28672, 4096, "Llama-3-8B / Mistral-7B fused gate/up"),
    (4096, 11008, "Llama-2-7B down"),
    (4096, 14336, "Llama-3-8B / Mistral-7B down"),
    (8192, 8192, "Llama-2/3-70B q/o proj"),
    (2048, 8192, "Llama-3-70B fused k/v"),
    (4608, 3584, "Qwen2.5-7B fused qkv"),
    (3584, 18944, "Qwen2.5-7B down"),
    (3072, 8192, "Llama-3.2-3B down"),
]
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DTYPES = ("fp16", "bf16")
QUICK_SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336)]
QUICK_BATCHES = (1, 4, 16)
QUICK_DTYPES = ("fp16",)
ITEMSIZE = 2              # fp16 and bf16
PEAK_FLOPS = 790e12       # H200 dense fp16/bf16 tensor-core FLOP/s (DESIGN v2)
TARGET_EFF, TARGET_SLACK_US = 0.95, 2.0
LARGE_BATCH, LARGE_EFF = 32, 0.9   # issue 21: batch 32-256 within floor / 0.9 + 2 us
MAX_ERR = 1e-2
ASSUMED_BW = 4.1e12       # --no-torch only: a copy bandwidth for the floors (BENCHMARKS.md)
FC_DTYPE = {"fp16": "f16", "bf16": "bf16"}
DTYPE_ALIASES = {"fp16": "fp16", "f16": "fp16", "half": "fp16", "float16": "fp16",
                 "bf16": "bf16", "bfloat16": "bf16"}
TABLE_COLS = ["shape", "dtype", "batch", "fusionc_us", "linear_us", "floor_us", "target_us",
              "pct_of_floor", "vs_linear", "err", "met", "path"]
CSV_COLS = ["shape", "model", "dtype", "batch", "bias", "lowering", "path", "fusionc_us",
            "linear_us", "floor_us", "target_us", "pct_of_floor", "vs_linear", "err", "met",
            "linear_err", "bytes", "flops", "bw_TBps", "sets", "note"]


# ---- points, shards, floors, rows: pure (no torch, no GPU) -------------------------------------

def shape_list(text: str) -> list[tuple[int, int]]:
    """``"4096x4096,28672x4096"`` -> [(4096, 4096), (28672, 4096)] (N x K; argparse type)."""
    out = []
    for item in text.split(","):
        parts = item.strip().lower().replace("×", "x").split("x")
        try:
            n, k = (int(p) for p in parts)
        except ValueError:
            n = k = 0
        if n < 1 or k < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: shapes are NxK, e.g. 4096x11008")
        out.append((n, k))
    return out


def dtype_list(text: str) -> tuple[str, ...]:
    """``"fp16,bf16"`` -> ("fp16", "bf16") (argparse type; f16 / bfloat16 accepted)."""
    out = tuple(DTYPE_ALIASES.get(t.strip().lower(), "") for t in text.split(","))
    if not out or "" in out:
        raise argparse.ArgumentTypeError(f"{text!r}: dtypes fp16 and/or bf16, comma-separated")
    return out


def shard_spec(text: str) -> tuple[int, int]:
    """``"0/3"`` -> (0, 3): every 3rd point from the first (argparse type)."""
    try:
        i, n = (int(p) for p in text.split("/"))
    except ValueError:
        i, n = -1, 0
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"{text!r}: a shard is i/n with 0 <= i < n")
    return i, n


def model_of(n: int, k: int) -> str:
    return next((m for sn, sk, m in SHAPES if (sn, sk) == (n, k)), "custom")


def points(shapes=None, dtypes=None, batches=None, quick=False, shard=None) -> list[dict]:
    """The points to run, in a fixed order (shape, then dtype, then batch); ``shard = (i, n)``
    keeps every n-th from the i-th. Unset lists take the defaults (``quick``: the headline)."""
    shapes = shapes or (QUICK_SHAPES if quick else [(n, k) for n, k, _ in SHAPES])
    dtypes = dtypes or (QUICK_DTYPES if quick else DTYPES)
    batches = batches or (QUICK_BATCHES if quick else BATCHES)
    out = [dict(n=n, k=k, dtype=d, batch=b) for n, k in shapes for d in dtypes for b in batches]
    if shard is not None:
        out = out[shard[0]::shard[1]]
    return out


def weight_sets(n: int, k: int, bias: bool = False) -> int:
    """Distinct (x, W) sets whose weights together exceed 3x L2: ceil(3·L2 / W bytes) + 1."""
    return math.ceil(3 * common.L2_BYTES / (n * k * ITEMSIZE + bias * n * ITEMSIZE)) + 1


def floor_bytes(n: int, k: int, batch: int, bias: bool = False) -> int:
    return (n * k + batch * k + batch * n + (n if bias else 0)) * ITEMSIZE


def floor_flops(n: int, k: int, batch: int) -> int:
    return 2 * batch * n * k


def floor_us(n: int, k: int, batch: int, bw: float, bias: bool = False) -> float:
    """max(bytes / copy bandwidth, FLOPs / 790 TFLOP/s), in µs."""
    return max(floor_bytes(n, k, batch, bias) / bw, floor_flops(n, k, batch) / PEAK_FLOPS) * 1e6


def target_us(floor: float, batch: int = 1) -> float:
    """The target time: floor / 0.95 + 2 us up to 16 rows, floor / 0.9 + 2 us from 32."""
    return floor / (LARGE_EFF if batch >= LARGE_BATCH else TARGET_EFF) + TARGET_SLACK_US


def summarize(p: dict, bw: float, *, bias=False, lowering="", path="", fusionc_us=None,
              linear_us=None, err=None, linear_err=None, note="") -> dict:
    """One result row (raw numbers; None where not measured) with the derived columns."""
    n, k, b = p["n"], p["k"], p["batch"]
    fl = floor_us(n, k, b, bw, bias)
    row = dict(shape=f"{n}x{k}", model=model_of(n, k), dtype=p["dtype"], batch=b, bias=bias,
               lowering=lowering, path=path, fusionc_us=fusionc_us, linear_us=linear_us,
               floor_us=fl, target_us=target_us(fl, b), err=err, linear_err=linear_err,
               bytes=floor_bytes(n, k, b, bias), flops=floor_flops(n, k, b), bw_TBps=bw / 1e12,
               sets=weight_sets(n, k, bias), note=note, pct_of_floor=None, vs_linear=None,
               met=None)
    if fusionc_us:
        row["pct_of_floor"] = 100 * fl / fusionc_us
        row["vs_linear"] = linear_us / fusionc_us if linear_us else None
        row["met"] = "ok" if fusionc_us <= row["target_us"] else "MISS"
    if err is not None and not err <= MAX_ERR:  # NaN fails too
        row["met"] = "FAIL"
    return row


def cell(col: str, v, for_csv: bool = False) -> str:
    """A row value as text: µs and % with one decimal (three in the CSV), errors 1.2e-03,
    ratios 1.23x (a bare number in the CSV), missing values empty."""
    if v is None:
        return ""
    if col in ("err", "linear_err"):
        return f"{v:.1e}" + ("" if for_csv or v <= MAX_ERR else " FAIL")
    if col == "vs_linear":
        return f"{v:.3f}" if for_csv else f"{v:.2f}x"
    if col == "bw_TBps":
        return f"{v:.3f}"
    if isinstance(v, bool):
        return str(int(v)) if for_csv else str(v)
    if isinstance(v, float):
        return f"{v:.3f}" if for_csv else f"{v:.1f}"
    return str(v)


def csv_row(row: dict) -> list[str]:
    return [cell(c, row.get(c), for_csv=True) for c in CSV_COLS]


def table(rows: list[dict]) -> str:
    return common.table([{c: cell(c, r.get(c)) for c in TABLE_COLS} for r in rows], TABLE_COLS)


def csv_path(args) -> str:
    if args.csv:
        return args.csv
    name = "gemv.csv" if args.shard is None else f"gemv-shard{args.shard[0]}of{args.shard[1]}.csv"
    return os.path.join(os.environ.get("OUT") or ".", name)


# ---- fusionc ----------------------------------------------------------------------------------

def gemv_module(n: int, k: int, dtype: str, bias: bool = False):
    """The graph ``@gemv``: y = linear(x, w[, b]) with x [B, K] (symbolic batch B)."""
    import fusionc as fc
    T = fc.dtype(FC_DTYPE[dtype])
    if bias:
        @fc.graph(name="gemv", x=T["B", k], w=T[n, k], b=T[n])
        def gemv(x, w, b):
            return fc.linear(x, w, b, name="y")
    else:
        @fc.graph(name="gemv", x=T["B", k], w=T[n, k])
        def gemv(x, w):
            return fc.linear(x, w, name="y")
    return gemv


def installed_lowering(compile_fn=None) -> str | None:
    """The default ``lowering=`` of the installed ``fusionc.compile``: "v1" when it has no such
    keyword (it predates the choice), None when the keyword has no default."""
    import inspect
    if compile_fn is None:
        import fusionc
        compile_fn = fusionc.compile
    p = inspect.signature(compile_fn).parameters.get("lowering")
    if p is None:
        return "v1"
    return None if p.default is inspect.Parameter.empty else p.default


def lowering_kwargs(requested: str, installed: str | None) -> dict:
    """``lowering=`` only when the user asked for other than what fusionc does by default."""
    return {} if requested == installed else {"lowering": requested}


class LoweringUnsupported(SystemExit):
    """The installed fusionc.compile takes no ``lowering=`` but another lowering was asked."""


def compile_point(p: dict, args, installed: str | None):
    """(compiled callable or None, path, note). path: "kernel" (fusionc's own kernels),
    "cublas" (fusionc's library path) or the host ops; a FusionError becomes the note."""
    import fusionc
    mod = gemv_module(p["n"], p["k"], p["dtype"], args.bias)
    kw = lowering_kwargs(args.lowering, installed)
    if getattr(args, "fused", False):   # v2's fused kernels even where its default takes cuBLAS
        from fusionc.passes.stream import v2_pipeline
        kw = dict(lowering="v2", pipeline=v2_pipeline(p["batch"]))
    try:
        fn = fusionc.compile(mod, max_batch=p["batch"], **kw)
    except TypeError as e:
        import inspect
        if not kw or "lowering" in inspect.signature(fusionc.compile).parameters:
            raise
        raise LoweringUnsupported(
            f"fusionc.compile() at {os.path.dirname(fusionc.__file__)} takes no lowering= "
            f"({e}); it predates lowering v2 (default v1). Run with --lowering v1, or put the "
            f"fusionc with lowering= first on PYTHONPATH.") from None
    except fusionc.errors.FusionError as e:
        return None, "error", f"{type(e).__name__}: {str(e).splitlines()[0]}"
    ops = {dict(launch="kernel", library_call="cublas").get(op.name, op.name)
           for op in fn.host.body}
    return fn, "+".join(sorted(ops)), ""


# ---- GPU --------------------------------------------------------------------------------------

def make_weights(p: dict, bias: bool) -> list[dict]:
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    n, k = p["n"], p["k"]
    return [dict(w=torch.randn(n, k, device="cuda", dtype=dt).mul_(1 / math.sqrt(k)),
                 **({"b": torch.randn(n, device="cuda", dtype=dt)} if bias else {}))
            for _ in range(weight_sets(n, k, bias))]


def check(fn, s: dict):
    """fusionc's and F.linear's norm-wise error against float64 x·Wᵀ (+ b) on set ``s``, the
    fusionc output poisoned with NaN first."""
    ref = s["x"].double() @ s["w"].double().T
    if "b" in s:
        ref += s["b"].double()
    lin = common.rel_err(F.linear(s["x"], s["w"], s.get("b")), ref)
    if fn is None:
        return None, lin
    out = torch.full((s["x"].shape[0], s["w"].shape[0]), float("nan"), dtype=s["x"].dtype,
                     device="cuda")
    got = fn(**s, outputs={fn.host.outputs[0].name: out})[0]
    torch.cuda.synchronize()
    return common.rel_err(got, ref), lin


def measure(p: dict, fn, weights: list[dict], reps: int) -> dict:
    """fusionc_us, linear_us, err, linear_err (and a note if fusionc failed to run) on
    ``weights``, each set with its own fresh x."""
    import fusionc
    sets = [dict(ws, x=torch.randn(p["batch"], p["k"], device="cuda", dtype=ws["w"].dtype))
            for ws in weights]
    res = {}
    try:
        res["err"], res["linear_err"] = check(fn, sets[0])
        if fn is not None:
            res["fusionc_us"] = common.time_graph([lambda s=s: fn(**s) for s in sets],
                                                  reps=reps) * 1e6
    except fusionc.errors.FusionError as e:  # reported in the table; F.linear still timed
        res["note"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    res["linear_us"] = common.time_graph([lambda s=s: F.linear(s["x"], s["w"], s.get("b"))
                                          for s in sets], reps=reps) * 1e6
    return res


# ---- main -------------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the 12 headline points")
    ap.add_argument("--shapes", type=shape_list, metavar="NxK,...", help="only these shapes")
    ap.add_argument("--batches", type=common.batch_list, metavar="B,...",
                    help=f"batch sizes (default {','.join(map(str, BATCHES))})")
    ap.add_argument("--dtypes", type=dtype_list, metavar="fp16,bf16", help="default both")
    ap.add_argument("--shard", type=shard_spec, metavar="i/n",
                    help="only every n-th point, from the i-th (0-based)")
    ap.add_argument("--bias", action="store_true", help="y = x·Wᵀ + b")
    ap.add_argument("--lowering", choices=("v1", "v2"), default="v2",
                    help="fusionc's lowering (passed on when not the installed default; v1 "
                         "only for an older installed fusionc: this one removed it)")
    ap.add_argument("--fused", action="store_true",
                    help="lowering v2's fused kernels at every batch (v2_pipeline), also where "
                         "its cost table takes the library path")
    ap.add_argument("--compile-only", action="store_true",
                    help="only compile fusionc's kernels into the cubin cache (no GPU, no torch)")
    ap.add_argument("--no-torch", "--dry-run", dest="no_torch", action="store_true",
                    help="no torch, no GPU: compile, floors at an assumed bandwidth, CSV, table")
    ap.add_argument("--no-fusionc", action="store_true", help="F.linear and floors only")
    ap.add_argument("--assume-bw", type=float, default=ASSUMED_BW / 1e12, metavar="TB/s",
                    help="copy bandwidth for the floors of --no-torch")
    ap.add_argument("--reps", type=int, default=30, help="graph replays per variant")
    ap.add_argument("--csv", help="CSV path (default $OUT/gemv.csv)")
    return ap.parse_args(argv)


def run(args) -> list[dict]:
    pts = points(args.shapes, args.dtypes, args.batches, args.quick, args.shard)
    installed = None if args.no_fusionc else installed_lowering()
    print(f"{len(pts)} points, lowering {args.lowering} (fusionc's default: {installed})"
          + (", bias" if args.bias else ""), flush=True)
    if args.compile_only:
        for p in pts:
            fn, path, note = compile_point(p, args, installed)
            print(f"{p['n']}x{p['k']} {p['dtype']} B={p['batch']} {path}:",
                  (fn.report().replace("\n", "; ") or "no fusionc kernel") if fn else note,
                  flush=True)
        return []
    if args.no_torch:
        bw = args.assume_bw * 1e12
        print(f"dry run: no timing, floors at an assumed {bw / 1e12:.2f} TB/s")
    else:
        if torch is None:
            raise SystemExit("torch is not installed: run with --no-torch or --compile-only")
        bw = common.copy_bandwidth()
        print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name()}")
    path = csv_path(args)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    rows, weights, key, t0 = [], None, None, time.time()
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(CSV_COLS)
        for p in pts:
            fn, fpath, note = (None, "-", "") if args.no_fusionc else compile_point(
                p, args, installed)
            res = {}
            if not args.no_torch:
                if key != (p["n"], p["k"], p["dtype"]):  # weights reused across batches
                    weights = key = None
                    torch.cuda.empty_cache()
                    weights, key = make_weights(p, args.bias), (p["n"], p["k"], p["dtype"])
                res = measure(p, fn, weights, args.reps)
            del fn
            note = "; ".join(x for x in (note, res.pop("note", "")) if x)
            rows.append(summarize(p, bw, bias=args.bias, lowering=args.lowering, path=fpath,
                                  note=note, **res))
            out.writerow(csv_row(rows[-1]))
            f.flush()
            print(" ".join(f"{c}={cell(c, rows[-1][c])}" for c in TABLE_COLS)
                  + (f" ({note})" if note else ""), flush=True)
    print(f"{len(rows)} points in {time.time() - t0:.0f} s; CSV {path}\n")
    print(table(rows))
    return rows


def main(argv=None):
    run(parse_args(argv))


if __name__ == "__main__":
    main()
