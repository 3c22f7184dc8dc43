"""Benchmark: fused SwiGLU MLP block (RMSNorm → gate/up → SiLU·mul → down → residual) —
fusionc vs PyTorch eager and torch.compile, each in a CUDA graph, vs the HBM floor:

    python3 benchmarks/mlp_block.py [--quick]
"""
from __future__ import annotations

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
from benchmarks import common, torch_blocks  # noqa: E402

MODELS = {"Llama-2-7B": dict(hidden=4096, intermediate=11008),
          "Llama-3-8B": dict(hidden=4096, intermediate=14336)}


def make_set(m, batch, dtype=torch.float16):
    dev = "cuda"
    s = lambda *shape: (torch.randn(*shape, device=dev) / math.sqrt(shape[-1])).to(dtype)  # noqa
    return dict(x=torch.randn(batch, m["hidden"], device=dev).to(dtype),
                mlp_norm=(1 + 0.1 * torch.randn(m["hidden"], device=dev)).to(dtype),
                w_gate_up=s(2 * m["intermediate"], m["hidden"]),
                w_down=s(m["hidden"], m["intermediate"]))


def floor_bytes(m, batch, itemsize=2):
    return (3 * m["hidden"] * m["intermediate"] + 2 * batch * m["hidden"]) * itemsize


def fusionc_mlp(m, batch, codegen=None):
    try:
        import fusionc
        import llama2_7b
    except ImportError as e:  # pragma: no cover
        print("fusionc unavailable:", e)
        return None
    mod = llama2_7b.mlp_block(hidden=m["hidden"], intermediate=m["intermediate"], eps=1e-5,
                              dtype="f16")
    try:
        return fusionc.compile(mod, max_batch=batch, autotune=TUNE, codegen=codegen)
    except fusionc.errors.FusionError as e:  # reported in the table
        print("fusionc cannot compile this point:", e)
        return None


def run_point(name, m, batch, bw, fn, alt=None):
    nbytes = floor_bytes(m, batch)
    sets = [make_set(m, batch) for _ in range(common.sets_needed(nbytes))]
    eager = lambda s: torch_blocks.mlp_block(s["x"], s["mlp_norm"], s["w_gate_up"],  # noqa
                                             s["w_down"], eps=1e-5)
    compiled = None if NO_COMPILE else torch.compile(eager, mode="max-autotune-no-cudagraphs",
                                                     dynamic=False)
    row = dict(model=name, batch=batch, floor_us=nbytes / bw * 1e6)
    return common.measure(row, sets, eager, compiled, fn, alt)


NO_COMPILE = False
TUNE = False


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
    return args.batch or ((1,) if args.quick else (1, 4, 16))


def compile_only(args):
    for name in MODELS:
        for b in batches(args):
            for opts in (args.codegen, args.alt) if args.alt else (args.codegen,):
                fn = fusionc_mlp(MODELS[name], b, opts)
                print(name, b, fn.report() if fn else "-")


def main():
    args = common.parse_args(__doc__)
    global NO_COMPILE, TUNE
    NO_COMPILE, TUNE = args.no_torch_compile, args.tune and not args.compile_only
    if args.tune and args.compile_only:
        return compile_candidates_only(args)
    if args.compile_only:
        return compile_only(args)
    bw = common.copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name()}")
    rows = []
    for name in MODELS:
        for b in batches(args):
            fn = None if args.no_fusionc else fusionc_mlp(MODELS[name], b, args.codegen)
            alt = None if args.no_fusionc or not args.alt else fusionc_mlp(MODELS[name], b,
                                                                           args.alt)
            rows.append(run_point(name, MODELS[name], b, bw, fn, alt))
            print(rows[-1], flush=True)
    print(common.table(rows, ["model", "batch", "fusionc_us", "eager_us", "compile_us",
                              "floor_us", "eff_%", "vs_compile", "vs_eager", "err"]
                       + (["alt_us", "alt_err"] if args.alt else [])))


if __name__ == "__main__":
    main()
