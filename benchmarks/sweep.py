"""Sweep fusionc variants (cluster size, QKV scheme, gemv loads in flight) of the attention and
MLP blocks at batch 1 and time each with the same method as the block benchmarks (CUDA graph
over rotating buffer sets). The seed of autotuning: it shows what the cost model's choice
leaves on the table.

    python3 benchmarks/sweep.py --compile-only     # CPU: fill the cubin cache
    python3 benchmarks/sweep.py                    # GPU: time every variant, table last
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

ATT = {"Llama-2-7B": dict(hidden=4096, heads=32, kv_heads=32, head_dim=128),
       "Llama-3-8B": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128)}
MLP = {"Llama-2-7B": dict(hidden=4096, intermediate=11008),
       "Llama-3-8B": dict(hidden=4096, intermediate=14336)}
KV = 4096


def variants():
    """(block, model, cluster, scheme, unroll)."""
    out = []
    for model, sizes in ATT.items():
        for c in ((2, 4, 8) if sizes["kv_heads"] == 32 else (4, 8, 16)):
            for scheme in ("splitk", "splitn"):
                for u in (4, 8):
                    out.append(("attention", model, c, scheme, u))
    for model in MLP:
        for c in (1, 2, 4, 8, 16):
            for u in (4, 8, 16):
                out.append(("mlp", model, c, "auto", u))
    return out


def build(v):
    import fusionc
    import llama2_7b
    from fusionc.codegen import CodegenOptions
    block, model, c, scheme, u = v
    if block == "attention":
        mod = llama2_7b.attention_block(**ATT[model], max_seq=KV, eps=1e-5, theta=10000.0,
                                        dtype="f16")
    else:
        mod = llama2_7b.mlp_block(**MLP[model], eps=1e-5, dtype="f16")
    try:
        return fusionc.compile(mod, max_batch=1, cluster=c, scheme=scheme, kv_len=KV,
                               codegen=CodegenOptions(gemv_unroll=u))
    except Exception as e:  # a configuration that does not fit: reported in the table
        print(v, "skipped:", str(e)[:160])
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    if args.compile_only:
        import concurrent.futures
        with concurrent.futures.ProcessPoolExecutor(2) as pool:
            for v, ok in zip(variants(), pool.map(_compiles, variants())):
                print(v, "ok" if ok else "skipped")
        return
    import torch
    from benchmarks import attention_block, common, mlp_block
    bw = common.copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    sets = {}
    rows = []
    for v in variants():
        block, model, c, scheme, u = v
        fn = build(v)
        if fn is None:
            continue
        if (block, model) not in sets:
            if block == "attention":
                nb = attention_block.floor_bytes(ATT[model], 1, KV)
                sets[block, model] = ([attention_block.make_set(ATT[model], 1, KV)
                                       for _ in range(common.sets_needed(nb))], nb)
            else:
                nb = mlp_block.floor_bytes(MLP[model], 1)
                sets[block, model] = ([mlp_block.make_set(MLP[model], 1)
                                       for _ in range(common.sets_needed(nb))], nb)
        bufs, nb = sets[block, model]
        us = common.time_graph([lambda s=s: fn(**s) for s in bufs]) * 1e6
        k = next(iter(fn.kernels.values())).source
        rows.append(dict(block=block, model=model, C=c, grid=k.grid, scheme=scheme, unroll=u,
                         us=us, floor_us=nb / bw * 1e6, eff=100 * nb / bw / (us * 1e-6)))
        print(rows[-1], flush=True)
        fn = None  # free the kernels before the next variant
        torch.cuda.synchronize()
    print(common.table(rows, ["block", "model", "C", "grid", "scheme", "unroll", "us",
                              "floor_us", "eff"]))


def _compiles(v) -> bool:
    return build(v) is not None


if __name__ == "__main__":
    main()
