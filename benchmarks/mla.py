"""Benchmark: DeepSeek-V2-Lite MLA attention block (RMSNorm → q and latent projections →
latent RMSNorm, RoPE → latent cache append → W_UK-absorbed attention over the latent cache →
W_UV → output projection → residual) — fusionc vs PyTorch eager and torch.compile, each in a
CUDA graph, vs the HBM floor. Run on the GPU machine:

    python3 benchmarks/mla.py [--quick] [--sweep]

``--sweep`` also times every (cluster size, heads per cluster) fusionc can build and reports
the fastest next to the cost model's choice. Prints a Markdown table (last) for BENCHMARKS.md.
Every variant rotates through buffer sets totalling >= 3x L2 (benchmarks/common.py).
"""
from __future__ import annotations

import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]
from benchmarks import common, torch_blocks  # noqa: E402

M = dict(hidden=2048, heads=16, nope=128, rope=64, v_head=128, latent=512)


def make_set(batch, kv, dtype=torch.bfloat16):
    """One buffer set (weights, latent cache with kv valid tokens, the new one at kv - 1)."""
    dev, h, H = "cuda", M["hidden"], M["heads"]
    s = lambda *shape: (torch.randn(*shape, device=dev) / math.sqrt(shape[-1])).to(dtype)  # noqa
    return dict(x=torch.randn(batch, h, device=dev).to(dtype),
                attn_norm=(1 + 0.1 * torch.randn(h, device=dev)).to(dtype),
                w_q=s(H * (M["nope"] + M["rope"]), h), w_kv_a=s(M["latent"] + M["rope"], h),
                kv_norm=(1 + 0.1 * torch.randn(M["latent"], device=dev)).to(dtype),
                w_uk_t=s(H, M["latent"], M["nope"]), w_uv=s(H, M["v_head"], M["latent"]),
                w_o=s(h, H * M["v_head"]),
                cache=torch.randn(batch, kv, M["latent"] + M["rope"], device=dev).to(dtype),
                positions=torch.full((batch,), kv - 1, dtype=torch.int32, device=dev),
                seq_lens=torch.full((batch,), kv, dtype=torch.int32, device=dev))


def floor_bytes(batch, kv, itemsize=2):
    H, h = M["heads"], M["hidden"]
    weights = (H * (M["nope"] + M["rope"]) + M["latent"] + M["rope"]) * h \
        + 2 * H * M["latent"] * M["nope"] + h * H * M["v_head"]
    cache = batch * kv * (M["latent"] + M["rope"])
    act = 2 * batch * h + batch * (M["latent"] + M["rope"])  # x in, out, new row written
    return (weights + cache + act) * itemsize


def fusionc_mla(batch, kv, pipeline=None, codegen=None):
    """fusionc.compile of the example's graph (cost model's choice, or ``pipeline``)."""
    import deepseek_v2_lite

    import fusionc
    try:
        return fusionc.compile(deepseek_v2_lite.build(max_seq=kv), max_batch=batch, kv_len=kv,
                               pipeline=pipeline, codegen=codegen)
    except fusionc.errors.FusionError as e:
        print("fusionc cannot compile this point:", e)
        return None


def _compile_job(job):
    fn = fusionc_mla(*job[:3], codegen=job[3])
    return fn.report().split(",")[0] if fn is not None else "-"


def sweep_pipelines(batch, kv):
    from fusionc.cost.h200 import H200
    return {f"C{c}G{g}N{n}": f"partition-cluster{{size={c},group={g},grid={n},"
                             f"max_batch={batch},batch={batch},kv_len={kv}}},fuse"
            for c in (2, 4, 8) for g in (1, 2, 4)
            for n in (H200.resident_clusters[c],) if n >= 16 // g}


def points(args):
    if args.quick:
        return [(b, 4096) for b in args.batch or (1,)]
    return [(b, kv) for b in args.batch or (1, 16) for kv in (1024, 4096, 16384)]


def run_point(batch, kv, bw, sweep, no_compile, codegen=None, alt=None):
    nbytes = floor_bytes(batch, kv)
    sets = [make_set(batch, kv) for _ in range(common.sets_needed(nbytes))]
    kw = dict(heads=M["heads"], nope=M["nope"], rope=M["rope"], latent=M["latent"], eps=1e-6,
              theta=10000.0)
    eager = lambda s: torch_blocks.mla_block(  # noqa: E731
        s["x"], s["attn_norm"], s["w_q"], s["w_kv_a"], s["kv_norm"], s["w_uk_t"], s["w_uv"],
        s["w_o"], s["cache"], s["positions"], kv, **kw)
    compiled = None if no_compile else common.fresh_compile(eager, "max-autotune-no-cudagraphs")
    fn = fusionc_mla(batch, kv, codegen=codegen)
    alt_fn = fusionc_mla(batch, kv, codegen=alt) if alt else None
    row = dict(batch=batch, kv=kv, floor_us=nbytes / bw * 1e6,
               config=fn.report().split(":")[1].split(",")[0].strip() if fn else "-")
    row = common.measure(row, sets, eager, compiled, fn, alt_fn)
    if sweep:
        best = (row.get("fusionc_us", math.inf), "default")
        for name, pipe in sweep_pipelines(batch, kv).items():
            f = fusionc_mla(batch, kv, pipe)
            if f is not None:
                t = common.time_graph([lambda s=s: f(**s) for s in sets]) * 1e6
                print(f"  {name}: {t:.1f} µs", flush=True)
                best = min(best, (t, name))
        row["best_us"], row["best"] = best
    return row


def main():
    args = common.parse_args(__doc__, lambda ap: ap.add_argument(
        "--sweep", action="store_true", help="time every (cluster size, heads per cluster)"))
    if args.compile_only:   # fill the cubin cache (no GPU needed), several processes
        import concurrent.futures
        jobs = [(b, kv, p, args.codegen) for b, kv in points(args)
                for p in [None] + (list(sweep_pipelines(b, kv).values()) if args.sweep else [])]
        jobs += [(b, kv, None, args.alt) for b, kv in points(args) if args.alt]
        with concurrent.futures.ProcessPoolExecutor() as pool:
            for (b, kv, p, _), fn in zip(jobs, pool.map(_compile_job, jobs)):
                print(b, kv, p or "default", fn, flush=True)
        return
    bw = common.copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name()}")
    rows = []
    for b, kv in points(args):
        rows.append(run_point(b, kv, bw, args.sweep, args.no_torch_compile, args.codegen,
                              args.alt))
        print(rows[-1], flush=True)
    print(common.table(rows, ["batch", "kv", "fusionc_us", "config", "eager_us", "compile_us",
                              "floor_us", "eff_%", "vs_compile", "vs_eager", "best_us", "best",
                              "err"] + (["alt_us", "alt_err"] if args.alt else [])))


if __name__ == "__main__":
    main()
