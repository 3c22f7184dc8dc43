"""Benchmark: fused attention block (RMSNorm → QKV → RoPE → KV append → decode attention →
O projection → residual) — fusionc vs PyTorch eager and torch.compile, each in a CUDA graph, vs
the HBM floor. Run on the GPU machine:

    python3 benchmarks/attention_block.py [--quick] [--lowering v2 [--compare-v1]] [--models A,B]
        [--kv 1024,4096]

``--lowering v2``: fusionc on design v2 (v2 linear kernels around attention units over every
SM; issue 22); ``--compare-v1`` then also times lowering v1 (column ``alt_us``).

Prints a Markdown table (last) for BENCHMARKS.md. Every variant rotates through buffer sets
totalling >= 3x L2 (benchmarks/common.py).
"""
from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
from benchmarks import common  # noqa: E402  (PyTorch only on the GPU machine)

MODELS = {"Llama-2-7B": dict(hidden=4096, heads=32, kv_heads=32, head_dim=128),
          "Llama-3-8B": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128),
          "Qwen3-4B": dict(hidden=2560, heads=32, kv_heads=8, head_dim=128),
          "Llama-3.2-3B": dict(hidden=3072, heads=24, kv_heads=8, head_dim=128),
          "Mistral-Nemo-12B": dict(hidden=5120, heads=32, kv_heads=8, head_dim=128),
          "Qwen2.5-7B": dict(hidden=3584, heads=28, kv_heads=4, head_dim=128),
          "Llama-2-13B": dict(hidden=5120, heads=40, kv_heads=40, head_dim=128),
          "Llama-2-70B": dict(hidden=8192, heads=64, kv_heads=8, head_dim=128),
          "Llama-3.2-1B": dict(hidden=2048, heads=32, kv_heads=8, head_dim=64),
          "Gemma-2B": dict(hidden=2048, heads=8, kv_heads=1, head_dim=256)}
MAX_CACHE_BYTES = 30e9   # points whose two caches exceed this are skipped
DEFAULT_MODELS = ("Llama-2-7B", "Llama-3-8B")


def make_set(m, batch, kv, dtype=None, hf=True):
    """One buffer set: weights, caches (kv tokens valid, the new one at kv - 1), activations;
    with ``hf`` also the caches in the layout of transformers ([B, kv_heads, S, D]) for the
    PyTorch baselines."""
    import torch
    dtype = dtype or torch.float16
    q, kvd = m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
    dev = "cuda"
    s = lambda *shape: (torch.randn(*shape, device=dev) / math.sqrt(shape[-1])).to(dtype)  # noqa
    cache = (batch, kv, m["kv_heads"], m["head_dim"])
    out = dict(x=torch.randn(batch, m["hidden"], device=dev).to(dtype),
               attn_norm=(1 + 0.1 * torch.randn(m["hidden"], device=dev)).to(dtype),
               w_qkv=s(q + 2 * kvd, m["hidden"]), w_o=s(m["hidden"], q),
               k_cache=torch.randn(*cache, device=dev).to(dtype),
               v_cache=torch.randn(*cache, device=dev).to(dtype),
               positions=torch.full((batch,), kv - 1, dtype=torch.int32, device=dev),
               seq_lens=torch.full((batch,), kv, dtype=torch.int32, device=dev))
    if hf:
        out["k_hf"] = out["k_cache"].transpose(1, 2).contiguous()
        out["v_hf"] = out["v_cache"].transpose(1, 2).contiguous()
    return out


def floor_bytes(m, batch, kv, itemsize=2):
    q, kvd = m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
    weights = (q + 2 * kvd) * m["hidden"] + m["hidden"] * q
    cache = 2 * batch * kv * kvd
    act = 2 * batch * m["hidden"] + 2 * batch * kvd  # x in, out, new k/v written
    return (weights + cache + act) * itemsize


FORMS = ("sdpa", "matmul")


def run_point(name, m, batch, kv, bw, fusionc_fn, alt=None):
    """The point's times: PyTorch eager and torch.compile as the faster of FORMS over the
    transformers cache layout (``form`` column: eager's / compile's winner), fusionc (and alt)
    over fusionc's; err against the same formulas over fusionc's layout."""
    from benchmarks import torch_blocks
    nbytes = floor_bytes(m, batch, kv)
    sets = [make_set(m, batch, kv) for _ in range(common.sets_needed(nbytes))]
    kw = dict(heads=m["heads"], kv_heads=m["kv_heads"], head_dim=m["head_dim"], eps=1e-5,
              theta=10000.0)
    ref = lambda s: torch_blocks.attention_block(  # noqa: E731
        s["x"], s["attn_norm"], s["w_qkv"], s["w_o"], s["k_cache"], s["v_cache"],
        s["positions"], kv, **kw)
    row = dict(model=name, batch=batch, kv=kv, floor_us=nbytes / bw * 1e6)
    common.measure(row, sets, ref, None, _own(fusionc_fn), _own(alt))
    times = {}
    for form in FORMS:
        fn = lambda s, form=form: torch_blocks.attention_block_hf(  # noqa: E731
            s["x"], s["attn_norm"], s["w_qkv"], s["w_o"], s["k_hf"], s["v_hf"],
            s["positions"], kv, form=form, **kw)
        times[("eager", form)] = common.time_graph([lambda s=s: fn(s) for s in sets]) * 1e6
        if not NO_COMPILE:
            c = common.fresh_compile(fn, COMPILE_MODE)
            times[("compile", form)] = common.time_graph([lambda s=s: c(s) for s in sets]) * 1e6
    del sets
    forms = []
    for base in ("eager", "compile"):
        got = {f: t for (b, f), t in times.items() if b == base}
        if got:
            best = min(got, key=got.get)
            row[f"{base}_us"] = got[best]
            forms.append(best)
            if "fusionc_us" in row:
                row[f"vs_{base}"] = f"{got[best] / row['fusionc_us']:.2f}x"
    row["form"] = "/".join(forms)
    return row


COMPILE_MODE = "max-autotune-no-cudagraphs"


def _own(fn):
    """``fn`` called with a buffer set's tensors except the PyTorch-layout caches."""
    if fn is None:
        return None
    return lambda **s: fn(**{k: v for k, v in s.items() if k not in ("k_hf", "v_hf")})


def fusionc_attention(m, batch, kv, codegen=None, lowering=None):
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
        if lowering == "v2":
            return fusionc.compile(mod, max_batch=batch, lowering="v2")
        return fusionc.compile(mod, max_batch=batch, kv_len=kv, autotune=TUNE, codegen=codegen,
                               lowering=lowering)
    except fusionc.errors.FusionError as e:  # reported in the table
        print("fusionc cannot compile this point:", e)
        return None


NO_COMPILE = False
TUNE = False


def points(args):
    models = args.models.split(",") if args.models else DEFAULT_MODELS
    if args.quick:
        return [(n, b, 4096) for n in models for b in args.batch or (1,)]
    kvs = tuple(int(k) for k in args.kv.split(",")) if args.kv else (1024, 4096, 16384)
    return [(n, b, kv) for n in models for b in args.batch or (1, 4, 16) for kv in kvs
            if 2 * b * kv * MODELS[n]["kv_heads"] * MODELS[n]["head_dim"] * 2 <= MAX_CACHE_BYTES]


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
        for opts, low in _variants(args):
            fn = fusionc_attention(MODELS[name], b, kv, opts, low)
            print(name, b, kv, fn.report().replace("\n", "; ") if fn else "-")


def _variants(args):
    """(codegen options, lowering) of the fusionc column, then of alt_us if asked for."""
    out = [(args.codegen, args.lowering)]
    if args.alt:
        out.append((args.alt, args.lowering))
    elif args.compare_v1:
        out.append((args.codegen, "v1"))
    return out


def _extra(ap):
    ap.add_argument("--lowering", choices=("v1", "v2"), default=None,
                    help="fusionc's lowering (default: fusionc.compile's choice)")
    ap.add_argument("--compare-v1", action="store_true",
                    help="with --lowering v2: also time lowering v1 (column alt_us)")
    ap.add_argument("--models", default=None, help="comma-separated names of MODELS")
    ap.add_argument("--kv", default=None, help="comma-separated KV lengths")
    ap.add_argument("--compile-mode", default=None,
                    help=f"torch.compile's mode (default {COMPILE_MODE})")


def main():
    args = common.parse_args(__doc__, _extra)
    global NO_COMPILE, TUNE
    NO_COMPILE, TUNE = args.no_torch_compile, args.tune and not args.compile_only
    global COMPILE_MODE
    COMPILE_MODE = args.compile_mode or COMPILE_MODE
    if args.tune and args.compile_only:
        return compile_candidates_only(args)
    if args.compile_only:
        return compile_only(args)
    import torch
    bw = common.copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name()}")
    rows = []
    for name, b, kv in points(args):
        var = _variants(args)
        fn = None if args.no_fusionc else fusionc_attention(MODELS[name], b, kv, *var[0])
        alt = None if args.no_fusionc or len(var) < 2 else fusionc_attention(
            MODELS[name], b, kv, *var[1])
        rows.append(run_point(name, MODELS[name], b, kv, bw, fn, alt))
        print(rows[-1], flush=True)
    print(common.table(rows, ["model", "batch", "kv", "fusionc_us", "eager_us", "compile_us",
                              "form", "floor_us", "eff_%", "vs_compile", "vs_eager", "err"]
                       + (["alt_us", "alt_err"] if len(_variants(args)) > 1 else [])))


if __name__ == "__main__":
    main()
