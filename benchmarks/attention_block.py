"""Benchmark: fused attention block (RMSNorm → QKV → RoPE → KV append → decode attention →
O projection → residual) — fusionc vs PyTorch eager and torch.compile, each in a CUDA graph, vs
the HBM floor. Run on the GPU machine:

    python3 benchmarks/attention_block.py [--quick | --headline | --sweep] [--shard i/n]
        [--models A,B] [--batch 1,16] [--kv 1024,4096]
        [--compile-mode default]

``--sweep``: every model of MODELS (ten head configurations: MHA 32/32 and 40/40, GQA 32/8,
28/4, 24/8, 64/8 and 8/1, head_dim 64 / 128 / 256, Qwen3-4B with QK-norm) at batch 1, 4, 16,
64, 256 and KV 1K, 4K, 16K, 64K, points whose caches exceed 30 GB skipped; ``--headline``:
the twelve points of HEADLINE. ``--shard i/n`` runs every n-th point from the i-th.

fusionc runs its default (lowering v2: v2 linear kernels around attention units over every
SM, issue 22; the mixed path past the fused bucket).

Prints a Markdown table (last) for BENCHMARKS.md and writes a CSV to
``$OUT/attention_block[-shard{i}of{n}].csv`` when ``$OUT`` is set. Every variant rotates
through buffer sets totalling >= 3x L2 (benchmarks/common.py).
"""
from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402  (PyTorch only on the GPU machine)

MODELS = {"Llama-2-7B": dict(hidden=4096, heads=32, kv_heads=32, head_dim=128),
          "Llama-3-8B": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128),
          "Qwen3-4B": dict(hidden=2560, heads=32, kv_heads=8, head_dim=128, qk_norm=True),
          "Llama-3.2-3B": dict(hidden=3072, heads=24, kv_heads=8, head_dim=128),
          "Mistral-Nemo-12B": dict(hidden=5120, heads=32, kv_heads=8, head_dim=128),
          "Qwen2.5-7B": dict(hidden=3584, heads=28, kv_heads=4, head_dim=128),
          "Llama-2-13B": dict(hidden=5120, heads=40, kv_heads=40, head_dim=128),
          "Llama-2-70B": dict(hidden=8192, heads=64, kv_heads=8, head_dim=128),
          "Llama-3.2-1B": dict(hidden=2048, heads=32, kv_heads=8, head_dim=64),
          "Gemma-2B": dict(hidden=2048, heads=8, kv_heads=1, head_dim=256)}
MAX_CACHE_BYTES = 30e9   # points whose two caches exceed this are skipped
DEFAULT_MODELS = ("Llama-2-7B", "Llama-3-8B")
SWEEP = dict(batch=(1, 4, 16, 64, 256), kv=(1024, 4096, 16384, 65536))
HEADLINE = [("Llama-2-7B", 1, 1024), ("Llama-2-7B", 16, 16384), ("Llama-3-8B", 1, 4096),
            ("Llama-3-8B", 16, 16384), ("Llama-3-8B", 64, 4096), ("Llama-3-8B", 256, 1024),
            ("Qwen3-4B", 4, 16384), ("Qwen2.5-7B", 16, 16384), ("Llama-2-70B", 1, 65536),
            ("Gemma-2B", 16, 4096), ("Llama-3.2-1B", 64, 16384), ("Llama-2-13B", 4, 4096)]


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
    if m.get("qk_norm"):
        for name in ("q_norm", "k_norm"):
            out[name] = (1 + 0.1 * torch.randn(m["head_dim"], device=dev)).to(dtype)
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
    norms = lambda s: dict(q_norm=s.get("q_norm"), k_norm=s.get("k_norm"))  # noqa: E731
    ref = lambda s: torch_blocks.attention_block(  # noqa: E731
        s["x"], s["attn_norm"], s["w_qkv"], s["w_o"], s["k_cache"], s["v_cache"],
        s["positions"], kv, **kw, **norms(s))
    row = dict(model=name, batch=batch, kv=kv, floor_us=nbytes / bw * 1e6)
    common.measure(row, sets, ref, None, _own(fusionc_fn), _own(alt))
    times = {}
    for form in FORMS:
        fn = lambda s, form=form: torch_blocks.attention_block_hf(  # noqa: E731
            s["x"], s["attn_norm"], s["w_qkv"], s["w_o"], s["k_hf"], s["v_hf"],
            s["positions"], kv, form=form, **kw, **norms(s))
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
    except ImportError as e:  # pragma: no cover
        print("fusionc unavailable:", e)
        return None
    mod = _module(m, kv)
    try:
        if lowering == "v2":
            return fusionc.compile(mod, max_batch=batch, lowering="v2", codegen=codegen)
        return fusionc.compile(mod, max_batch=batch, kv_len=kv, autotune=TUNE, codegen=codegen,
                               lowering=lowering)
    except fusionc.errors.FusionError as e:  # reported in the table
        print("fusionc cannot compile this point:", e)
        return None


NO_COMPILE = False
TUNE = False


def points(args):
    """(model, batch, kv) in a fixed order; every n-th from the i-th with ``--shard i/n``."""
    sweep = getattr(args, "sweep", False)
    models = args.models.split(",") if args.models else (tuple(MODELS) if sweep else
                                                         DEFAULT_MODELS)
    if getattr(args, "headline", False):
        out = list(HEADLINE)
    elif args.quick:
        out = [(n, b, 4096) for n in models for b in args.batch or (1,)]
    else:
        kvs = tuple(int(k) for k in args.kv.split(",")) if args.kv else \
            SWEEP["kv"] if sweep else (1024, 4096, 16384)
        batches = args.batch or (SWEEP["batch"] if sweep else (1, 4, 16))
        out = [(n, b, kv) for n in models for b in batches for kv in kvs
               if 2 * b * kv * MODELS[n]["kv_heads"] * MODELS[n]["head_dim"] * 2
               <= MAX_CACHE_BYTES]
    shard = getattr(args, "shard", None)
    return out[shard[0]::shard[1]] if shard else out


def _module(m, kv):
    """fusionc's attention block of model sizes ``m`` over a cache of ``kv`` tokens, fp16."""
    from fusionc.models.blocks import attention_block
    return attention_block(hidden=m["hidden"], heads=m["heads"], kv_heads=m["kv_heads"],
                           head_dim=m["head_dim"], max_seq=kv, eps=1e-5, theta=10000.0,
                           dtype="f16", qk_norm=m.get("qk_norm", False))


def compile_candidates_only(args):
    from fusionc.tune.search import compile_candidates
    for name, b, kv in points(args):
        mod = _module(MODELS[name], kv)
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
    return out


def _extra(ap):
    ap.add_argument("--lowering", choices=("v2",), default=None,
                    help="fusionc's lowering (v2, its only one, the default)")
    ap.add_argument("--models", default=None, help="comma-separated names of MODELS")
    ap.add_argument("--kv", default=None, help="comma-separated KV lengths")
    ap.add_argument("--compile-mode", default=None,
                    help=f"torch.compile's mode (default {COMPILE_MODE})")
    from benchmarks.gemv import shard_spec
    ap.add_argument("--sweep", action="store_true", help="the issue's batch x KV grid, all models")
    ap.add_argument("--headline", action="store_true", help="the twelve HEADLINE points")
    ap.add_argument("--shard", type=shard_spec, default=None, metavar="i/n")


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
        try:
            rows.append(run_point(name, MODELS[name], b, kv, bw, fn, alt))
        except Exception as e:   # noqa: BLE001  (one failed point must not lose the others)
            print(f"{name} {b} {kv}: the point failed: {type(e).__name__}: {e}", flush=True)
            rows.append(dict(model=name, batch=b, kv=kv, err=f"FAILED {type(e).__name__}"))
            torch.cuda.synchronize()
        print(rows[-1], flush=True)
    cols = ["model", "batch", "kv", "fusionc_us", "eager_us", "compile_us", "form", "floor_us",
            "eff_%", "vs_compile", "vs_eager", "err"] + \
        (["alt_us", "alt_err"] if len(_variants(args)) > 1 else [])
    print(common.table(rows, cols))
    common.write_csv("attention_block", args.shard, cols, rows)


if __name__ == "__main__":
    main()
