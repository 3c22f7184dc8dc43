"""Benchmark: fused SwiGLU MLP block (RMSNorm → gate/up → SiLU·mul → down → residual) —
fusionc vs PyTorch eager and torch.compile, each in a CUDA graph, vs the HBM floor (weights +
x in + y out at the copy bandwidth measured in the same run):

    python3 benchmarks/mlp_block.py [--quick] [--compare-unchained | --compare-chained |
        --compare-wide | --compare-library]
        [--shard i/n]
        [--models NAME,...] [--batch 1,4,16] [--dtype f16|bf16]

Shapes: eight open models, hidden 2048–8192 (some intermediates no multiple of 1024); batch 1,
2, 4, 8, 16, 32, 64, 128, 256 by default. As ``alt_us``:
``--compare-unchained`` / ``--compare-chained`` v2 with one kernel per linear or the MLP in one
persistent kernel (``v2_pipeline(chain=...)``; the default picks by the batch),
``--compare-wide`` the same in one kernel of 128-row weight tiles,
``--compare-library`` fusionc's library path (cuBLAS GEMMs, CuPy elementwise kernels).
torch.compile runs in its default mode (``--max-autotune``: max-autotune-no-cudagraphs). The
table goes to stdout, a CSV to ``$OUT/mlp_block[-shard{i}of{n}].csv`` when ``$OUT`` is set.
"""
from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
from benchmarks import common  # noqa: E402  (PyTorch only on the GPU machine)

MODELS = {"Llama-2-7B": dict(hidden=4096, intermediate=11008),
          "Llama-3-8B": dict(hidden=4096, intermediate=14336),
          "Llama-3.2-1B": dict(hidden=2048, intermediate=8192),
          "Llama-3.2-3B": dict(hidden=3072, intermediate=8192),
          "Qwen2.5-7B": dict(hidden=3584, intermediate=18944),
          "Qwen3-4B": dict(hidden=2560, intermediate=9728),
          "Mistral-Nemo-12B": dict(hidden=5120, intermediate=14336),
          "Llama-2-70B-TP8": dict(hidden=8192, intermediate=3584)}
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LOWERING = "v2"
DTYPE = "f16"


def make_set(m, batch, dtype=None):
    import torch
    dev = "cuda"
    dtype = dtype or {"f16": torch.float16, "bf16": torch.bfloat16}[DTYPE]
    s = lambda *shape: (torch.randn(*shape, device=dev) / math.sqrt(shape[-1])).to(dtype)  # noqa
    return dict(x=torch.randn(batch, m["hidden"], device=dev).to(dtype),
                mlp_norm=(1 + 0.1 * torch.randn(m["hidden"], device=dev)).to(dtype),
                w_gate_up=s(2 * m["intermediate"], m["hidden"]),
                w_down=s(m["hidden"], m["intermediate"]))


def floor_bytes(m, batch, itemsize=2):
    return (3 * m["hidden"] * m["intermediate"] + 2 * batch * m["hidden"]) * itemsize


def fusionc_mlp(m, batch, codegen=None, lowering=None):
    try:
        import fusionc
        import llama2_7b
    except ImportError as e:  # pragma: no cover
        print("fusionc unavailable:", e)
        return None
    mod = llama2_7b.mlp_block(hidden=m["hidden"], intermediate=m["intermediate"], eps=1e-5,
                              dtype=DTYPE)
    lowering = lowering or LOWERING
    pipeline = None
    if lowering in ("v2-unchained", "v2-chained", "v2-wide"):   # one kernel against two
        from fusionc.passes.stream import v2_pipeline
        lowering, pipeline = "v2", v2_pipeline(batch, chain=lowering != "v2-unchained",
                                               rows=128 if lowering == "v2-wide" else 64)
    elif lowering == "library":   # fusionc's library path (cuBLAS GEMMs, CuPy kernels)
        from fusionc.runtime.pipelines import library_pipeline
        lowering, pipeline = "v2", library_pipeline(mod.graphs[0])
    try:
        return fusionc.compile(mod, max_batch=batch, autotune=TUNE, codegen=codegen,
                               lowering=lowering, pipeline=pipeline)
    except fusionc.errors.FusionError as e:  # reported in the table
        print("fusionc cannot compile this point:", e)
        return None


def run_point(name, m, batch, bw, fn, alt=None):
    import torch
    from benchmarks import torch_blocks
    nbytes = floor_bytes(m, batch)
    sets = [make_set(m, batch) for _ in range(common.sets_needed(nbytes))]
    eager = lambda s: torch_blocks.mlp_block(s["x"], s["mlp_norm"], s["w_gate_up"],  # noqa
                                             s["w_down"], eps=1e-5)
    compiled = None if NO_COMPILE else common.fresh_compile(
        eager, "max-autotune-no-cudagraphs" if MAX_AUTOTUNE else None)
    row = dict(model=name, batch=batch, floor_us=nbytes / bw * 1e6)
    return common.measure(row, sets, eager, compiled, fn, alt)


NO_COMPILE = False
TUNE = False
MAX_AUTOTUNE = False


def compile_candidates_only(args):
    from fusionc.tune.search import compile_candidates
    import llama2_7b
    for name in MODELS:
        for b in (1,) if args.quick else (1, 4, 16):
            m = MODELS[name]
            mod = llama2_7b.mlp_block(hidden=m["hidden"], intermediate=m["intermediate"],
                                      eps=1e-5, dtype="f16")
            print(name, b, len(compile_candidates(mod.graphs[0], b, 4096)), "candidates")


def batches(args):
    return args.batch or ((1,) if args.quick else BATCHES)


def points(args) -> list[tuple[str, int]]:
    """(model, batch) in a fixed order; ``--shard i/n`` keeps every n-th from the i-th."""
    names = args.models.split(",") if args.models else list(MODELS)
    bad = [n for n in names if n not in MODELS]
    if bad:
        raise SystemExit(f"unknown model {bad[0]!r}: one of " + ", ".join(MODELS))
    out = [(n, b) for n in names for b in batches(args)]
    return out[args.shard[0]::args.shard[1]] if args.shard else out


def variants(args):
    """(codegen options, lowering) of fusionc's column and of ``alt_us``."""
    main = (args.codegen, LOWERING)
    alt = (args.alt, LOWERING) if args.alt else None
    if args.compare_unchained or args.compare_chained:
        alt = (None, "v2-unchained" if args.compare_unchained else "v2-chained")
    if args.compare_library:
        alt = (None, "library")
    if args.compare_wide:
        alt = (None, "v2-wide")
    return main, alt


def compile_only(args):
    for name, b in points(args):
        for v in variants(args):
            if v is not None:
                fn = fusionc_mlp(MODELS[name], b, *v)
                print(name, b, v[1], fn.report() if fn else "-", flush=True)


def extra_args(ap):
    from benchmarks.gemv import shard_spec
    ap.add_argument("--lowering", choices=("v2",), default="v2",
                    help="fusionc's lowering (v2, its only one)")
    ap.add_argument("--compare-unchained", action="store_true",
                    help="v2 with one kernel per linear as the alt_us column")
    ap.add_argument("--compare-chained", action="store_true",
                    help="v2 with the MLP in one persistent kernel as the alt_us column")
    ap.add_argument("--compare-wide", action="store_true",
                    help="the MLP in one kernel of 128-row tiles (wgmma) as the alt_us column")
    ap.add_argument("--compare-library", action="store_true",
                    help="fusionc's library path (cuBLAS GEMMs) as the alt_us column")
    ap.add_argument("--shard", type=shard_spec, default=None, metavar="i/n")
    ap.add_argument("--models", default=None, help="comma-separated names of MODELS")
    ap.add_argument("--dtype", choices=("f16", "bf16"), default="f16")
    ap.add_argument("--max-autotune", action="store_true",
                    help="torch.compile in max-autotune-no-cudagraphs mode")


def main():
    args = common.parse_args(__doc__, extra_args)
    global NO_COMPILE, TUNE, LOWERING, DTYPE, MAX_AUTOTUNE
    NO_COMPILE, TUNE = args.no_torch_compile, args.tune and not args.compile_only
    LOWERING, DTYPE, MAX_AUTOTUNE = args.lowering, args.dtype, args.max_autotune
    if args.tune and args.compile_only:
        return compile_candidates_only(args)
    if args.compile_only:
        return compile_only(args)
    import torch
    bw = common.copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name()}")
    rows = []
    (opts, low), alt_v = variants(args)
    for name, b in points(args):
        fn = None if args.no_fusionc else fusionc_mlp(MODELS[name], b, opts, low)
        alt = None if args.no_fusionc or alt_v is None else fusionc_mlp(MODELS[name], b, *alt_v)
        try:
            rows.append(run_point(name, MODELS[name], b, bw, fn, alt))
        except Exception as e:   # noqa: BLE001  (one failed point must not lose the others)
            print(f"{name} batch {b}: the point failed: {type(e).__name__}: {e}", flush=True)
            rows.append(dict(model=name, batch=b, err=f"FAILED {type(e).__name__}"))
            torch.cuda.synchronize()
        print(rows[-1], flush=True)
    cols = ["model", "batch", "fusionc_us", "eager_us", "compile_us", "floor_us", "eff_%",
            "vs_compile", "vs_eager", "err"] + (["alt_us", "alt_err"] if alt_v else [])
    print(common.table(rows, cols))
    common.write_csv("mlp_block", args.shard, cols, rows)


if __name__ == "__main__":
    main()
