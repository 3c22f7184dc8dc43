"""Benchmark: time to first token of one prompt (issue 25) — fusionc's chunked prefill
(``Decoder.prefill``, chunks of up to 256 tokens), fusionc one decode step per token, and
PyTorch (causal SDPA + cuBLAS, the whole prompt at once, captured in a CUDA graph) on the same
random weights, in the same run:

    python3 benchmarks/prefill.py [--model Llama-3-8B] [--prompt 512,2048] [--chunk 256]
    python3 benchmarks/prefill.py --compile-only       # fill the cubin cache, no GPU

Targets: chunked <= 1.5x PyTorch's time to first token, and >= 20x faster than one step per
token. Times are medians of 3 runs (the token-by-token path once: it takes seconds), from the
prompt's ids on the host to the first token's logits on the GPU. ``$OUT/prefill.csv`` when
``$OUT`` is set.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.decode import MODELS  # noqa: E402

COLS = ["model", "prompt", "chunked_ms", "steps_ms", "torch_ms", "vs_torch", "vs_steps", "err",
        "torch_err"]


def parse(argv=None):
    from benchmarks.common import batch_list
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(MODELS), default="Llama-3-8B")
    ap.add_argument("--prompt", type=batch_list, default=(512, 2048),
                    help="prompt lengths, comma-separated")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--compile-only", action="store_true",
                    help="only compile fusionc's kernels into the cubin cache (no GPU needed)")
    ap.add_argument("--no-steps", action="store_true",
                    help="skip one decode step per token (seconds per prompt)")
    return ap.parse_args(argv)


def decoder(cfg, max_seq: int):
    from fusionc.models import Decoder
    return Decoder(cfg, batch=1, max_seq=max_seq, kv_len=max_seq)


def _timed(fn, reps: int = 3) -> tuple[float, object]:
    """Median wall-clock seconds of ``fn()`` (synchronized) and its last result."""
    import cupy
    times, out = [], None
    for _ in range(reps):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = fn()
        cupy.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def torch_prefill(cfg, weights, max_seq: int, f32: bool = False):
    """PyTorch's prompt pass on fusionc's weights (zero-copy views): ``run(tokens) -> fp32
    logits of the last token``. ``f32``: every weight widened to fp32 as its layer runs, fp32
    activations and caches — the reference both 16-bit runs are measured against (their
    errors compound over the layers and the prompt; the budget is PyTorch's own)."""
    import cupy
    import torch
    from benchmarks import torch_blocks
    tdt = torch.float16 if cfg.dtype == "f16" else torch.bfloat16
    wide = (lambda t: t.float()) if f32 else (lambda t: t)

    def view(a):
        return torch.as_tensor(a.view(cupy.int16), device="cuda").view(tdt)
    layers = [{k: view(v) for k, v in w.items()} for w in weights[0]]
    shape = (1, cfg.kv_heads, max_seq, cfg.head_dim)
    cdt = torch.float32 if f32 else tdt
    caches = [(torch.empty(shape, dtype=cdt, device="cuda"),
               torch.empty(shape, dtype=cdt, device="cuda")) for _ in layers]
    embed, norm, head = (wide(view(weights[1][k])) for k in ("embed", "final_norm", "lm_head"))
    kw = dict(heads=cfg.heads, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, eps=cfg.eps,
              theta=cfg.theta, scaling=cfg.rope_scaling)

    def run(tokens):
        x = torch.nn.functional.embedding(tokens, embed)
        for w, (kc, vc) in zip(layers, caches):
            w = {k: wide(v) for k, v in w.items()}
            qk = dict(q_norm=w["q_norm"], k_norm=w["k_norm"]) if cfg.qk_norm else {}
            x = torch_blocks.prefill_attention_block(x, w["attn_norm"], w["w_qkv"], w["w_o"],
                                                     kc, vc, **kw, **qk)
            x = torch_blocks.mlp_block(x, w["mlp_norm"], w["w_gate_up"], w["w_down"],
                                       eps=cfg.eps)
        return (torch_blocks.rms_norm(x[-1:], norm, cfg.eps) @ head.t()).float()
    return run


def run_point(name, cfg, n, weights, args) -> dict:
    import numpy as np
    import torch
    from benchmarks import common
    from fusionc.models import generate
    prompt = np.random.default_rng(n).integers(0, cfg.vocab, n)
    dec = decoder(cfg, n + 8)
    dec.load(iter(weights[0]), weights[1])
    dec.prefill([prompt], chunk=args.chunk)   # compiles the chunk graphs, loads the kernels
    t, got = _timed(lambda: dec.prefill([prompt], chunk=args.chunk).copy())
    row = dict(model=name, prompt=n, chunked_ms=t * 1e3)
    if not args.no_steps:
        generate(dec, prompt[:2], 1, prefill=False)   # captures the decode step
        row["steps_ms"] = generate(dec, prompt, 1, prefill=False).prompt_ms
    del dec
    import cupy
    cupy.get_default_memory_pool().free_all_blocks()
    run = torch_prefill(cfg, weights, n + 8)
    tokens = torch.as_tensor(prompt, device="cuda")
    with torch.no_grad():
        ref = torch_prefill(cfg, weights, n + 8, f32=True)(tokens)[0]
        torch.cuda.empty_cache()
        row["err"] = f"{common.rel_err(torch.as_tensor(got[0], device='cuda'), ref):.1e}"
        row["torch_err"] = f"{common.rel_err(run(tokens)[0], ref):.1e}"
        row["torch_ms"] = common.time_graph([lambda: run(tokens)], reps=5) * 1e3
    row["vs_torch"] = f"{row['chunked_ms'] / row['torch_ms']:.2f}x"
    if "steps_ms" in row:
        row["vs_steps"] = f"{row['steps_ms'] / row['chunked_ms']:.1f}x faster"
    torch.cuda.empty_cache()
    return row


def main() -> int:
    args = parse()
    cfg = MODELS[args.model]
    if args.compile_only:
        for n in args.prompt:
            decoder(cfg, n + 8)
            print(f"compiled {args.model} for prompts of {n}", flush=True)
        return 0
    import cupy
    from benchmarks import common
    from fusionc.models.weights import random_head, random_layer
    weights = ([random_layer(cfg, i, cfg.dtype, cupy) for i in range(cfg.layers)],
               random_head(cfg, cfg.dtype, cupy))
    rows = []
    for n in args.prompt:
        rows.append(run_point(args.model, cfg, n, weights, args))
        print(common.table(rows[-1:], [c for c in COLS if c in rows[-1]]), flush=True)
    common.write_csv("prefill", None, COLS, rows)
    print(common.table(rows, COLS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
