"""Benchmark: the MLA attention block (RMSNorm → q and latent projections → latent RMSNorm, RoPE →
latent cache append → W_UK-absorbed attention over the latent cache → W_UV → output projection
→ residual) of DeepSeek-V2-Lite (16 heads, hidden 2048) and a DeepSeek-V3 layer (128 heads,
hidden 7168, the query compressed through q_lora 1536) — fusionc vs PyTorch
eager and torch.compile, each in a CUDA graph, vs the floor (DESIGN §7: bytes over the copy
bandwidth or FLOPs over 790 TFLOP/s, whichever is larger). Run on the GPU machine:

    python3 benchmarks/mla.py [--layer V2-Lite|V3] [--batch 1,16] [--kv 1024,4096] [--alt chain]
                              [--shard i/n] [--no-torch-compile] [--compile-mode default]
    python3 benchmarks/mla.py --compile-only [--shard i/n]   # fill the cubin cache, no GPU

Points: batch 1, 16, 64, 256 × KV 1K, 4K, 16K per layer, those whose caches fit (:func:`fits`);
``--shard i/n`` runs every n-th from the i-th; ``$OUT/mla[-shard…].csv`` when ``$OUT`` is
set. Every variant rotates through buffer sets totalling >= 3x L2 (benchmarks/common.py).
fusionc compiles on lowering v2 (the MLA units: MLA's only lowering). Prints a Markdown table
(last) for BENCHMARKS.md.
"""
from __future__ import annotations

import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]

LAYERS = {"V2-Lite": dict(hidden=2048, heads=16, nope=128, rope=64, v_head=128, latent=512,
                         q_lora=0),
          "V3": dict(hidden=7168, heads=128, nope=128, rope=64, v_head=128, latent=512,
                     q_lora=1536)}
BATCHES, KVS = (1, 16, 64, 256), (1024, 4096, 16384)
PEAK_FLOPS = 790e12   # a large bf16 matmul through PyTorch on our H200 (DESIGN §7)
COLS = ["layer", "batch", "kv", "fusionc_us", "config", "eager_us", "compile_us", "floor_us",
        "bound", "eff_%", "vs_compile", "vs_eager", "err", "alt_us", "alt_err"]


def weight_elems(m: dict) -> int:
    H, h, r = m["heads"], m["hidden"], m["q_lora"]
    q = H * (m["nope"] + m["rope"])
    w_q = (r * h + q * r + r) if r else q * h   # w_q_a, w_q_b, q_a_norm, or w_q
    return w_q + (m["latent"] + m["rope"]) * h + 2 * H * m["latent"] * m["nope"] \
        + h * H * m["v_head"]


def floor_bytes(m: dict, batch: int, kv: int, itemsize: int = 2) -> int:
    """Weights, the cache rows read, x in, out and the new cache row written."""
    cache = batch * kv * (m["latent"] + m["rope"])
    act = 2 * batch * m["hidden"] + batch * (m["latent"] + m["rope"])
    return (weight_elems(m) + cache + act) * itemsize


def flops(m: dict, batch: int, kv: int) -> int:
    """2 · batch · (weights + heads · kv · (2 · latent + rope)): every weight once per row, the
    scores over latent + rope and P·V over latent per head and token."""
    return 2 * batch * (weight_elems(m) + m["heads"] * kv * (2 * m["latent"] + m["rope"]))


def floor_us(m: dict, batch: int, kv: int, bw: float) -> tuple[float, str]:
    """(the floor in µs, "bytes" or "flops": which bounds it)."""
    t_b, t_f = floor_bytes(m, batch, kv) / bw, flops(m, batch, kv) / PEAK_FLOPS
    return (max(t_b, t_f) * 1e6, "bytes" if t_b >= t_f else "flops")


def fits(m: dict, batch: int, kv: int, limit: float = 40e9) -> bool:
    """Whether the buffer sets of a point stay within ``limit`` bytes (the caches dominate)."""
    return batch * kv * (m["latent"] + m["rope"]) * 2 <= limit / 3


def points(args) -> list[tuple[str, int, int]]:
    out = [(name, b, k) for name in args.layer or list(LAYERS)
           for b in args.batch or BATCHES for k in args.kv or KVS if fits(LAYERS[name], b, k)]
    return out[args.shard[0]::args.shard[1]] if args.shard else out


def build(m: dict, kv: int):
    import deepseek_v2_lite
    return deepseek_v2_lite.build(hidden=m["hidden"], heads=m["heads"], qk_nope=m["nope"],
                                  qk_rope=m["rope"], v_head=m["v_head"], kv_lora=m["latent"],
                                  max_seq=kv, q_lora=m["q_lora"])


def fusionc_mla(m: dict, batch: int, kv: int, chain: bool | None = None):
    """fusionc.compile of the example's graph at these sizes (None where it cannot); ``chain``
    True / False: the linears after the MLA units (W_UV, w_o) as phases of one kernel or one
    kernel each (default: the pipeline's choice, chained above 8 rows)."""
    import fusionc
    pipeline = None
    if chain is not None:
        from fusionc.lower.linear_v2 import WIDE_ROWS
        from fusionc.passes.stream import v2_pipeline
        pipeline = v2_pipeline(batch, chain=chain, rows=WIDE_ROWS)
    try:
        return fusionc.compile(build(m, kv), max_batch=batch, kv_len=kv, lowering="v2",
                               pipeline=pipeline)
    except fusionc.errors.FusionError as e:
        print("fusionc cannot compile this point:", e)
        return None


def make_set(m: dict, batch: int, kv: int):
    """One buffer set (weights, latent cache with kv valid tokens, the new one at kv - 1)."""
    import torch
    dev, h, H, dtype = "cuda", m["hidden"], m["heads"], torch.bfloat16
    s = lambda *shape: (torch.randn(*shape, device=dev) / math.sqrt(shape[-1])).to(dtype)  # noqa
    r, q = m["q_lora"], H * (m["nope"] + m["rope"])
    query = dict(w_q_a=s(r, h), q_a_norm=(1 + 0.1 * torch.randn(r, device=dev)).to(dtype),
                 w_q_b=s(q, r)) if r else dict(w_q=s(q, h))
    return dict(x=torch.randn(batch, h, device=dev).to(dtype),
                attn_norm=(1 + 0.1 * torch.randn(h, device=dev)).to(dtype),
                **query, w_kv_a=s(m["latent"] + m["rope"], h),
                kv_norm=(1 + 0.1 * torch.randn(m["latent"], device=dev)).to(dtype),
                w_uk_t=s(H, m["latent"], m["nope"]), w_uv=s(H, m["v_head"], m["latent"]),
                w_o=s(h, H * m["v_head"]),
                cache=torch.randn(batch, kv, m["latent"] + m["rope"], device=dev).to(dtype),
                positions=torch.full((batch,), kv - 1, dtype=torch.int32, device=dev),
                seq_lens=torch.full((batch,), kv, dtype=torch.int32, device=dev))


def buffer_sets(m: dict, batch: int, kv: int) -> list[dict]:
    """Enough buffer sets (:func:`make_set`) to rotate past 3x L2 (benchmarks/common.py)."""
    from benchmarks import common
    return [make_set(m, batch, kv) for _ in range(common.sets_needed(floor_bytes(m, batch, kv)))]


def run_point(layer: str, batch: int, kv: int, bw: float, args) -> dict:
    from benchmarks import common, torch_blocks
    m = LAYERS[layer]
    sets = buffer_sets(m, batch, kv)
    kw = dict(heads=m["heads"], nope=m["nope"], rope=m["rope"], latent=m["latent"], eps=1e-6,
              theta=10000.0)
    wq = lambda s: s["w_q"] if "w_q" in s else (s["w_q_a"], s["q_a_norm"], s["w_q_b"])  # noqa
    eager = lambda s: torch_blocks.mla_block(  # noqa: E731
        s["x"], s["attn_norm"], wq(s), s["w_kv_a"], s["kv_norm"], s["w_uk_t"], s["w_uv"],
        s["w_o"], s["cache"], s["positions"], kv, **kw)
    compiled = None if args.no_torch_compile else \
        common.fresh_compile(eager, args.compile_mode)
    fn = fusionc_mla(m, batch, kv)
    alt = fusionc_mla(m, batch, kv, chain=args.alt == "chain") if args.alt else None
    fl, bound = floor_us(m, batch, kv, bw)
    row = dict(layer=layer, batch=batch, kv=kv, floor_us=fl, bound=bound,
               config=fn.report().split(":")[1].split(",")[0].strip() if fn else "-")
    return common.measure(row, sets, eager, compiled, fn, alt)


def parse(argv=None):
    import argparse

    from benchmarks.common import batch_list
    from benchmarks.gemv import shard_spec
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", choices=list(LAYERS), action="append")
    ap.add_argument("--batch", type=batch_list, help="batch sizes, comma-separated")
    ap.add_argument("--kv", type=batch_list, help="KV lengths, comma-separated")
    ap.add_argument("--shard", type=shard_spec, default=None, metavar="i/n")
    ap.add_argument("--compile-only", action="store_true",
                    help="only compile fusionc's kernels into the cubin cache (no GPU needed)")
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--alt", choices=("chain", "unchain"),
                    help="also time fusionc with W_UV and w_o chained in one kernel, or one "
                         "kernel each, on fused kernels of 128-row tiles (the default's path up "
                         "to 32 rows; above, the default takes the mixed path): alt_us, alt_err")
    ap.add_argument("--compile-mode", default="max-autotune-no-cudagraphs",
                    help="torch.compile's mode (default: %(default)s; 'default' compiles faster)")
    return ap.parse_args(argv)


def main() -> int:
    args = parse()
    todo = points(args)
    if args.compile_only:
        for layer, b, k in todo:
            fn = fusionc_mla(LAYERS[layer], b, k)
            if args.alt:
                fusionc_mla(LAYERS[layer], b, k, chain=args.alt == "chain")
            print(layer, b, k, fn.report().split(",")[0] if fn else "-", flush=True)
        return 0
    import torch

    from benchmarks import common
    bw = common.copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name()}; "
          f"{len(todo)} points", flush=True)
    rows = []
    for layer, b, k in todo:
        rows.append(run_point(layer, b, k, bw, args))
        print(common.table(rows[-1:], [c for c in COLS if c in rows[-1]]), flush=True)
        torch.cuda.empty_cache()
    common.write_csv("mla", args.shard, COLS, rows)
    print(common.table(rows, COLS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
