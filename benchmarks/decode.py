"""Benchmark: one decode step of a whole model (embedding, every layer, final norm, LM head),
random weights — fusionc (one CUDA graph of its fused kernels and its step's ends, replayed)
vs PyTorch eager and torch.compile of the same model on its own fast cache layout
(transformers' ``[B, kv_heads, max_seq, head_dim]``), each captured in a CUDA graph, vs the HBM
floor (every layer weight and the LM head read once, the batch's embedding rows, and the
valid KV read once, over the copy bandwidth measured in the same run):

    python3 benchmarks/decode.py [--model Llama-3-8B] [--batch 1,16] [--kv 1024]
                                 [--shard i/n] [--max-autotune] [--pdl] [--tune]
    python3 benchmarks/decode.py --compile-only [--shard i/n]   # fill the cubin cache, no GPU

Models (issue 24): Llama-2-7B (MHA), Llama-3-8B (GQA 32/8), Qwen3-4B (QK-norm, heads ×
head_dim ≠ hidden, tied embeddings) and Llama-3.2-3B (llama3 RoPE scaling, tied embeddings);
batch 1, 4, 16, 64, 256 × KV 1K, 8K, skipping points whose weights and KV caches do not fit
(:func:`fits`). ``--shard i/n`` runs every n-th point from the i-th; ``$OUT/decode[-shard…].csv``
when ``$OUT`` is set. torch.compile uses its default mode; ``--max-autotune`` adds
mode="max-autotune-no-cudagraphs" (minutes of autotuning per shape). ``--pdl`` also times
fusionc with programmatic dependent launch between its kernels. The weights (6–16 GB) are far
larger than L2, so no buffer rotation is needed. ``err``: fusionc's logits against eager's
(the GPU model tests assert correctness against transformers).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fusionc.models.config import ModelConfig  # noqa: E402

MODELS = {
    "Llama-2-7B": ModelConfig("llama", 32, 4096, 32, 32, 128, 11008, 32000, 1e-5, 10000.0,
                              max_position=8192, dtype="f16"),
    "Llama-3-8B": ModelConfig("llama", 32, 4096, 32, 8, 128, 14336, 128256, 1e-5, 500000.0,
                              max_position=8192, dtype="bf16"),
    "Qwen3-4B": ModelConfig("qwen3", 36, 2560, 32, 8, 128, 9728, 151936, 1e-6, 1000000.0,
                            tie_embeddings=True, max_position=40960, dtype="bf16"),
    "Llama-3.2-3B": ModelConfig("llama", 28, 3072, 24, 8, 128, 8192, 128256, 1e-5, 500000.0,
                                rope_scaling=(32.0, 1.0, 4.0, 8192.0), tie_embeddings=True,
                                max_position=131072, dtype="bf16"),
}
BATCHES, KVS = (1, 4, 16, 64, 256), (1024, 8192)
GPU_BYTES = 110 << 30   # of an H200's 141 GB: weights + one set of KV caches, the rest spare
SPARE = 0.78            # that share of the card's memory where a GPU is present (H100: 62 GB)
COLS = ["model", "batch", "kv", "fusionc_ms", "pdl_ms", "eager_ms", "compile_ms", "autotune_ms",
        "floor_ms", "x_floor", "vs_compile", "vs_eager", "err"]


def kv_bytes(cfg: ModelConfig, batch: int, kv: int) -> int:
    """K and V caches of every layer for ``batch`` rows of capacity ``kv``."""
    return 2 * cfg.layers * batch * kv * cfg.kv_heads * cfg.head_dim * 2


def floor_bytes(cfg: ModelConfig, batch: int, kv: int) -> int:
    """What one step must move: the weights without the embedding table (only the batch's rows
    of it are read; a tied table is read once, as the LM head), and the valid KV once."""
    item = 2
    table = 0 if cfg.tie_embeddings else cfg.vocab * cfg.hidden * item
    return cfg.weight_bytes() - table + batch * cfg.hidden * item + kv_bytes(cfg, batch, kv)


def fits(cfg: ModelConfig, batch: int, kv: int) -> bool:
    """Whether the weights and one set of KV caches fit in :func:`gpu_bytes` (fusionc's and
    PyTorch's caches are never held at once)."""
    return cfg.weight_bytes() + kv_bytes(cfg, batch, kv) <= gpu_bytes()


def gpu_bytes() -> int:
    """Bytes a point may take: :data:`SPARE` of this GPU's memory, else (no GPU: compiling
    only) :data:`GPU_BYTES`. An H100 lacks room for Llama-2-7B at batch 16, KV 8K (77 GB)."""
    try:
        import cupy
        return int(SPARE * cupy.cuda.runtime.memGetInfo()[1])
    except Exception:   # noqa: BLE001 - no CuPy, no driver or no device: the H200 budget
        return GPU_BYTES


def points(args) -> list[tuple[str, int, int]]:
    """(model, batch, kv) in a fixed order, the points that fit; every n-th from the i-th with
    ``--shard i/n``."""
    out = [(m, b, k) for m in (args.model or list(MODELS)) for b in (args.batch or BATCHES)
           for k in (args.kv or KVS) if fits(MODELS[m], b, k)]
    return out[args.shard[0]::args.shard[1]] if args.shard else out


def decoder(cfg, batch: int, kv: int, tune: bool = False, pdl: bool = False):
    """fusionc's Decoder for one point (compiles through the cubin cache; no weights yet);
    ``tune``: autotune each layer graph on the GPU first (stored, reused by later runs);
    ``pdl``: programmatic dependent launch between the layer kernels."""
    from fusionc.models import Decoder
    return Decoder(cfg, batch=batch, max_seq=kv, kv_len=kv, autotune=tune, pdl=pdl)


def compile_candidates(cfg, batch: int, kv: int) -> None:
    """Every autotuning candidate of the point's layer graphs into the cubin cache (no GPU)."""
    from fusionc.models.blocks import layer_module
    from fusionc.tune.search import compile_candidates as candidates
    for g in layer_module(cfg, kv).graphs:
        candidates(g, batch, kv, progress=False)


def kv_values(cfg, batch: int, kv: int, layer: int, which: int, dtype: str):
    """Random K (``which`` 0) or V (1) of layer ``layer`` for the first ``kv`` positions,
    ``[batch, kv, kv_heads, head_dim]`` device bits: the same values for both layouts."""
    import cupy
    from fusionc.models.weights import float32_to_bits
    rs = cupy.random.RandomState(1 + 2 * layer + which)
    shape = (batch, kv, cfg.kv_heads, cfg.head_dim)
    return float32_to_bits(rs.standard_normal(shape, dtype=cupy.float32), dtype, cupy)


def fusionc_point(cfg, batch, kv, weights, args, pdl: bool):
    """fusionc's logits (a copy) and time per step (s) at one point, its KV caches filled with
    :func:`kv_values`; the decoder is freed before returning."""
    import cupy
    import numpy as np
    dec = decoder(cfg, batch, kv, args.tune, pdl=pdl)
    dec.load(iter(weights[0]), weights[1])
    for i, w in enumerate(dec.layers):
        for j, k in enumerate(("k_cache", "v_cache")):
            w[k][:, :kv] = kv_values(cfg, batch, kv, i, j, dec.dtype)
    got = dec.step(*step_inputs(batch, kv)).copy()   # captures the step
    dec.stream.synchronize()
    for _ in range(3):
        dec.replay()
    times = []
    for _ in range(30):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record(dec.stream)
        dec.replay()
        b.record(dec.stream)
        b.synchronize()
        times.append(cupy.cuda.get_elapsed_time(a, b) / 1e3)
    del dec
    _free()
    return got, statistics.median(times)


def step_inputs(batch: int, kv: int):
    """Tokens and positions of the timed step: every row's new token at position kv - 1."""
    import numpy as np
    return np.arange(batch) * 7 + 11, np.full(batch, kv - 1)


def torch_step(cfg, batch: int, kv: int, weights):
    """The same model in PyTorch (benchmarks/torch_blocks.py) on fusionc's weights (zero-copy
    views) and its own caches ``[B, kv_heads, kv, head_dim]`` holding :func:`kv_values`;
    returns ``step(attn, mlp) → fp32 logits`` and the caches (to free)."""
    import cupy
    import torch
    from benchmarks import torch_blocks
    tdt = torch.float16 if cfg.dtype == "f16" else torch.bfloat16

    def view(a):  # 16-bit storage through int16 (CUDA array interface), then reinterpreted
        return torch.as_tensor(a.view(cupy.int16), device="cuda").view(tdt)
    layers = [{k: view(v) for k, v in w.items()} for w in weights[0]]
    for i, w in enumerate(layers):
        for j, k in enumerate(("k_cache", "v_cache")):
            w[k] = view(kv_values(cfg, batch, kv, i, j, cfg.dtype)).transpose(1, 2).contiguous()
            _free()
    head = weights[1]
    embed, norm, lm_head = (view(head[k]) for k in ("embed", "final_norm", "lm_head"))
    toks, pos = (torch.as_tensor(a, device="cuda") for a in step_inputs(batch, kv))
    kw = dict(heads=cfg.heads, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, eps=cfg.eps,
              theta=cfg.theta, scaling=cfg.rope_scaling)

    def step(attn, mlp):
        x = torch.nn.functional.embedding(toks, embed)
        for w in layers:
            qk = dict(q_norm=w["q_norm"], k_norm=w["k_norm"]) if cfg.qk_norm else {}
            x = attn(x, w["attn_norm"], w["w_qkv"], w["w_o"], w["k_cache"], w["v_cache"], pos,
                     kv, **kw, **qk)
            x = mlp(x, w["mlp_norm"], w["w_gate_up"], w["w_down"], eps=cfg.eps)
        return (torch_blocks.rms_norm(x, norm, cfg.eps) @ lm_head.t()).float()
    return step, layers


def run_point(name, cfg, batch, kv, bw, weights, args) -> dict:
    import torch
    from benchmarks import common, torch_blocks
    row = dict(model=name, batch=batch, kv=kv, floor_ms=floor_bytes(cfg, batch, kv) / bw * 1e3)
    got, t = fusionc_point(cfg, batch, kv, weights, args, pdl=False)
    row["fusionc_ms"] = t * 1e3
    if args.pdl:
        row["pdl_ms"] = fusionc_point(cfg, batch, kv, weights, args, pdl=True)[1] * 1e3
    step, caches = torch_step(cfg, batch, kv, weights)
    attn, mlp = torch_blocks.attention_block_hf, torch_blocks.mlp_block
    with torch.no_grad():
        ref = step(attn, mlp)
        row["err"] = f"{common.rel_err(torch.as_tensor(got, device='cuda'), ref):.1e}"
        row["eager_ms"] = common.time_graph([lambda: step(attn, mlp)]) * 1e3
        modes = [] if args.no_torch_compile else \
            [("compile", "default")] + ([("autotune", "max-autotune-no-cudagraphs")]
                                        if args.max_autotune else [])
        for col, mode in modes:
            t0 = time.time()
            ca, cm = (common.fresh_compile(f, mode) for f in (attn, mlp))
            row[f"{col}_ms"] = common.time_graph([lambda: step(ca, cm)]) * 1e3
            print(f"  torch.compile ({mode}) ready in {time.time() - t0:.0f} s", flush=True)
    del step, caches
    _free()
    row["x_floor"] = f"{row['fusionc_ms'] / row['floor_ms']:.2f}"
    for base in ("compile", "eager"):
        if f"{base}_ms" in row:
            row[f"vs_{base}"] = f"{row[f'{base}_ms'] / row['fusionc_ms']:.2f}x"
    return row


def _free() -> None:
    import cupy
    try:
        import torch
        torch.cuda.empty_cache()
    except ImportError:
        pass
    cupy.get_default_memory_pool().free_all_blocks()


def parse(argv=None):
    from benchmarks.common import batch_list
    from benchmarks.gemv import shard_spec
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(MODELS), action="append")
    ap.add_argument("--batch", type=batch_list, help="batch sizes, comma-separated")
    ap.add_argument("--kv", type=batch_list, help="KV lengths, comma-separated")
    ap.add_argument("--shard", type=shard_spec, default=None, metavar="i/n")
    ap.add_argument("--compile-only", action="store_true",
                    help="only compile fusionc's kernels into the cubin cache (no GPU needed)")
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--max-autotune", action="store_true")
    ap.add_argument("--pdl", action="store_true",
                    help="also time fusionc with programmatic dependent launch (column pdl_ms)")
    ap.add_argument("--tune", action="store_true",
                    help="autotune fusionc's layer kernels first (with --compile-only: compile "
                         "every candidate)")
    return ap.parse_args(argv)


def main() -> int:
    args = parse()
    todo = points(args)
    if args.compile_only:
        for m, b, k in todo:
            decoder(MODELS[m], b, k, pdl=False)
            if args.pdl:
                decoder(MODELS[m], b, k, pdl=True)
            if args.tune:
                compile_candidates(MODELS[m], b, k)
            print(f"compiled {m} batch {b} KV {k}", flush=True)
        return 0
    import cupy
    from benchmarks import common
    from fusionc.models.weights import random_head, random_layer
    bw = common.copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; {len(todo)} points", flush=True)
    rows = []
    for m in dict.fromkeys(p[0] for p in todo):
        cfg = MODELS[m]
        weights = ([random_layer(cfg, i, cfg.dtype, cupy) for i in range(cfg.layers)],
                   random_head(cfg, cfg.dtype, cupy))
        for _, b, k in (p for p in todo if p[0] == m):
            rows.append(run_point(m, cfg, b, k, bw, weights, args))
            print(common.table(rows[-1:], [c for c in COLS if c in rows[-1]]), flush=True)
        del weights
        _free()
    common.write_csv("decode", args.shard, COLS, rows)
    print(common.table(rows, COLS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
