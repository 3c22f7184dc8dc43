"""Benchmark: fused attention block (RMSNorm → QKV → RoPE → KV append → decode attention →
O projection → residual) — fusionc vs PyTorch eager and torch.compile, each in a CUDA graph, vs
the HBM floor. Run on the GPU machine:

    python3 benchmarks/attention_block.py [--quick]

Prints a Markdown table (last) for BENCHMARKS.md. Every variant rotates through buffer sets
totalling >= 3x L2 (benchmarks/common.py).
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

MODELS = {"Llama-2-7B": dict(hidden=4096, heads=32, kv_heads=32, head_dim=128),
          "Llama-3-8B": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128)}


def make_set(m, batch, kv, dtype=torch.float16):
    """One buffer set: weights, caches (kv tokens valid, the new one at kv - 1), activations."""
    q, kvd = m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
    dev = "cuda"
    s = lambda *shape: (torch.randn(*shape, device=dev) / math.sqrt(shape[-1])).to(dtype)  # noqa
    return dict(x=torch.randn(batch, m["hidden"], device=dev).to(dtype),
                attn_norm=(1 + 0.1 * torch.randn(m["hidden"], device=dev)).to(dtype),
                w_qkv=s(q + 2 * kvd, m["hidden"]), w_o=s(m["hidden"], q),
                k_cache=torch.randn(batch, kv, m["kv_heads"], m["head_dim"], device=dev).to(dtype),
                v_cache=torch.randn(batch, kv, m["kv_heads"], m["head_dim"], device=dev).to(dtype),
                positions=torch.full((batch,), kv - 1, dtype=torch.int32, device=dev),
                seq_lens=torch.full((batch,), kv, dtype=torch.int32, device=dev))


def floor_bytes(m, batch, kv, itemsize=2):
    q, kvd = m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
    weights = (q + 2 * kvd) * m["hidden"] + m["hidden"] * q
    cache = 2 * batch * kv * kvd
    act = 2 * batch * m["hidden"] + 2 * batch * kvd  # x in, out, new k/v written
    return (weights + cache + act) * itemsize


def run_point(name, m, batch, kv, bw, fusionc_fn, alt=None):
    nbytes = floor_bytes(m, batch, kv)
    sets = [make_set(m, batch, kv) for _ in range(common.sets_needed(nbytes))]
    kw = dict(heads=m["heads"], kv_heads=m["kv_heads"], head_dim=m["head_dim"], eps=1e-5,
              theta=10000.0)
    eager = lambda s: torch_blocks.attention_block(  # noqa: E731
        s["x"], s["attn_norm"], s["w_qkv"], s["w_o"], s["k_cache"], s["v_cache"],
        s["positions"], kv, **kw)
    compiled = None if NO_COMPILE else common.fresh_compile(eager, "max-autotune-no-cudagraphs")
    row = dict(model=name, batch=batch, kv=kv, floor_us=nbytes / bw * 1e6)
    return common.measure(row, sets, eager, compiled, fusionc_fn, alt)


def fusionc_attention(m, batch, kv, codegen=None):
    """fusionc.compile of the example's attention graph, or None when unavailable."""
    try:
        import fusionc
        import llama2_7b
    except ImportError as e:  # pragma: no cover
        print("fusionc unavailable:", e)
        return None
    mod = llama2_7b.attention_block(hidden=m["hidden"], heads=m["heads"],
                                    kv_heads=m["kv_heads"], head_dim=m["head_dim"],
                                    max_seq=kv, eps=1e-5, theta=10000.0, dtype="f16")
    try:
        return fusionc.compile(mod, max_batch=batch, kv_len=kv, autotune=TUNE, codegen=codegen)
    except fusionc.errors.FusionError as e:  # reported in the table
        print("fusionc cannot compile this point:", e)
        return None


NO_COMPILE = False
TUNE = False


def points(args):
    if args.quick:
        return [("Llama-2-7B", b, 4096) for b in args.batch or (1,)] + [
            ("Llama-3-8B", b, 4096) for b in args.batch or (1,)]
    return [(n, b, kv) for n in MODELS for b in args.batch or (1, 4, 16)
            for kv in (1024, 4096, 16384)]


def compile_candidates_only(args):
    from fusionc.tune.search import compile_candidates
    import llama2_7b
    for name, b, kv in points(args):
        m = MODELS[name]
        mod = llama2_7b.attention_block(hidden=m["hidden"], heads=m["heads"],
                                        kv_heads=m["kv_heads"], head_dim=m["head_dim"],
                                        max_seq=kv, eps=1e-5, theta=10000.0, dtype="f16")
        print(name, b, kv, len(compile_candidates(mod.graphs[0], b, kv)), "candidates")


def compile_only(args):
    for name, b, kv in points(args):
        for opts in (args.codegen, args.alt) if args.alt else (args.codegen,):
            fn = fusionc_attention(MODELS[name], b, kv, opts)
            print(name, b, kv, fn.report().replace("\n", "; ") if fn else "-")


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
    for name, b, kv in points(args):
        fn = None if args.no_fusionc else fusionc_attention(MODELS[name], b, kv, args.codegen)
        alt = None if args.no_fusionc or not args.alt else fusionc_attention(
            MODELS[name], b, kv, args.alt)
        rows.append(run_point(name, MODELS[name], b, kv, bw, fn, alt))
        print(rows[-1], flush=True)
    print(common.table(rows, ["model", "batch", "kv", "fusionc_us", "eager_us", "compile_us",
                              "floor_us", "eff_%", "vs_compile", "vs_eager", "err"]
                       + (["alt_us", "alt_err"] if args.alt else [])))


if __name__ == "__main__":
    main()
