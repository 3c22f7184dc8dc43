"""Two-GPU checks of the peer-to-peer all-reduce and the TP2 decode layer; run one process per
GPU: ``fusionc launch -n 2 -- python3 scripts/tp2_check.py --out DIR [--quick]``.

Each rank writes ``DIR/rank<r>.json`` with the measured errors, the hashes of its outputs (both
ranks must match bit for bit) and what failed; ``tests/gpu/test_tp2_gpu.py`` asserts on them.

Checks: (1) every variant (all_reduce, + add, + add + RMSNorm), one-shot and two-shot, f16 and
bf16, 1 to 8192 tokens, against a float64 reference and against NCCL's all-reduce followed by a
float64 add + RMSNorm; outputs poisoned with NaN first; fresh random inputs (rank r's partial
sums from seed + r, so every rank can build the reference); (2) 10 000 back-to-back calls
alternating two inputs, and CUDA-graph replays; (3) a rank launching another grid size, and a
rank not launching at all: both reported as CommError, no hang; (4) the NCCL fallback; (5) the
TP2 Llama layer (examples/tp2_llama_layer.py) against the single-GPU layer.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

D = 4096


def f64_reference(xs, res, w, eps):
    s = sum(x.astype(np.float64) for x in xs)
    if res is None:
        return None, s
    h = s + res.astype(np.float64)
    if w is None:
        return None, h
    return h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps) * w.astype(np.float64), h


def rel(a, b) -> float:
    a = np.asarray(a, np.float64)
    if not np.isfinite(a).all():
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def to_np(t):
    import torch
    return t.float().cpu().numpy() if t.dtype == torch.bfloat16 else t.cpu().numpy()


def digest(*ts) -> str:
    h = hashlib.sha256()
    for t in ts:
        if t is not None:
            h.update(t.contiguous().view(-1).view(dtype=__import__("torch").uint8).cpu().numpy())
    return h.hexdigest()[:16]


def inputs(tokens, dtype, rank, world, seed):
    """Every rank's x (rank r from seed + r), the shared residual and weight, as torch tensors
    on this GPU (this rank's x) and as numpy (all ranks, for the reference)."""
    import torch
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    xs = [torch.from_numpy(np.random.default_rng(seed + r).standard_normal((tokens, D),
                                                                          np.float32)).to(tdt)
          for r in range(world)]
    rng = np.random.default_rng(seed + 1000)
    res = torch.from_numpy(rng.standard_normal((tokens, D), np.float32)).to(tdt)
    w = torch.from_numpy((1 + 0.1 * rng.standard_normal(D)).astype(np.float32)).to(tdt)
    npf = [to_np(x) for x in xs]
    return xs[rank].cuda(), res.cuda(), w.cuda(), npf, to_np(res), to_np(w)


def check_variants(comm, report, quick):
    import torch
    import torch.distributed as dist
    tokens = [1, 3, 37, 128, 1000, 2048] + ([] if quick else [8191, 8192])
    errs, hashes = {}, {}
    for dtype, T in [(d, t) for d in ("f16", "bf16") for t in tokens]:
        x, res, w, xs, rn, wn = inputs(T, dtype, comm.rank, comm.world, seed=T)
        ref_y, ref_h = f64_reference(xs, rn, wn, 1e-5)
        nccl = x.clone()
        dist.all_reduce(nccl)
        nccl_h = to_np(nccl).astype(np.float64) + rn.astype(np.float64)
        nccl_y = nccl_h / np.sqrt(np.mean(nccl_h ** 2, -1, keepdims=True) + 1e-5) * wn
        for algo in ("oneshot", "twoshot"):
            for kind in ("ar", "add", "norm"):
                oy = torch.full_like(x, float("nan"))
                oh = torch.full_like(x, float("nan"))
                r_ = res if kind != "ar" else None
                w_ = w if kind == "norm" else None
                comm.all_reduce(x, r_, w_, 1e-5, out_y=oy if w_ is not None else None,
                                out_h=oh, algo=algo)
                torch.cuda.synchronize()
                comm.check()
                key = f"{dtype}/{T}/{algo}/{kind}/{comm.ctas}"
                want_h = f64_reference(xs, rn if r_ is not None else None, None, 0)[1]
                e = {"h": rel(to_np(oh), want_h)}
                if kind == "norm":
                    e["y"] = rel(to_np(oy), ref_y)
                    e["y_vs_nccl"] = rel(to_np(oy), nccl_y)
                    e["h_vs_nccl"] = rel(to_np(oh), nccl_h)
                errs[key] = e
                hashes[key] = digest(oh, oy if kind == "norm" else None)
    report.setdefault("variants", {}).update(errs)
    report.setdefault("variant_hashes", {}).update(hashes)


def check_back_to_back(comm, report, quick):
    """Alternate two inputs over many calls into a ring of outputs; every output in the ring
    must equal the single-call result of its input, bit for bit."""
    import torch
    n = 2000 if quick else 10000
    outs = {}
    for T in (1, 512):
        A = inputs(T, "f16", comm.rank, comm.world, seed=7)
        B = inputs(T, "f16", comm.rank, comm.world, seed=8)
        want = []
        for x, res, w, *_ in (A, B):
            y, h = comm.all_reduce(x, res, w)
            want.append((y.clone(), h.clone()))
        ring = [(torch.empty_like(A[0]), torch.empty_like(A[0])) for _ in range(16)]
        bad = 0
        t0 = time.perf_counter()
        for i in range(n):
            x, res, w, *_ = A if i % 2 == 0 else B
            comm.all_reduce(x, res, w, out_y=ring[i % 16][0], out_h=ring[i % 16][1],
                            algo="twoshot" if (i // 16) % 2 else "oneshot")
            if i % 16 == 15:
                torch.cuda.synchronize()
                for j in range(16):
                    wy, wh = want[j % 2]
                    bad += int(not (torch.equal(ring[j][0], wy) and torch.equal(ring[j][1], wh)))
        comm.check()
        outs[T] = {"calls": n, "mismatches": bad, "seconds": time.perf_counter() - t0}
        # graph replays: 32 calls captured once, replayed 300 times
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                for i in range(32):
                    x, res, w, *_ = A if i % 2 == 0 else B
                    comm.all_reduce(x, res, w, out_y=ring[i % 16][0], out_h=ring[i % 16][1])
        gbad = 0
        for rep in range(300):
            for j in range(16):
                ring[j][0].fill_(float("nan"))
            g.replay()
            if rep % 50 == 49:
                torch.cuda.synchronize()
                for j in range(16):
                    wy, wh = want[j % 2]
                    gbad += int(not (torch.equal(ring[j][0], wy) and torch.equal(ring[j][1], wh)))
        torch.cuda.synchronize()
        comm.check()
        outs[T].update(graph_replays=300, graph_mismatches=gbad)
    report["back_to_back"] = outs


def check_failures(report):
    """Mismatched calls (another CTA count, another token count) and an absent rank: a
    CommError on every rank, no hang; the communicator then refuses further calls."""
    import torch

    from fusionc.comm import Communicator
    from fusionc.errors import InputError
    out = {}
    rank = int(os.environ["RANK"])
    try:   # different settings are refused when the communicator is built
        Communicator(ctas=8 if rank == 1 else 16, max_bytes=1 << 20, backend="p2p")
        out["settings"] = "accepted"
    except InputError as e:
        out["settings"] = f"InputError: {e.message}"
    for case in ("grid", "tokens", "absent"):
        comm = Communicator(ctas=16, max_bytes=1 << 20, timeout_s=0.5, backend="p2p")
        if case == "grid" and rank == 1:
            comm.ctas = 8   # a bug past the setup check: the kernel must still report it
        x = torch.randn(8 if case == "tokens" and rank == 1 else 4, D, device="cuda",
                        dtype=torch.float16)
        t0 = time.perf_counter()
        out[case] = _outcome(comm, x, launch=not (case == "absent" and rank == 1))
        out[case + "_seconds"] = time.perf_counter() - t0
        comm.group.barrier()   # rank 1 launches nothing on this communicator until here
        out[case + "_after"] = _outcome(comm, x, launch=True)
        comm.group.barrier()
        comm.close()
    report["failures"] = out


def _outcome(comm, x, launch: bool) -> str:
    from fusionc.comm import CommError
    try:
        if launch:
            comm.all_reduce(x, x, x[0])
        comm.check()
        return "no error"
    except CommError as e:
        return f"CommError: {e.message}"


def check_nccl_fallback(report):
    import torch

    from fusionc.comm import Communicator
    comm = Communicator(backend="nccl", max_bytes=8 << 20)
    x, res, w, xs, rn, wn = inputs(37, "f16", comm.rank, comm.world, seed=3)
    y, h = comm.all_reduce(x, res, w, 1e-5)
    torch.cuda.synchronize()
    ref_y, ref_h = f64_reference(xs, rn, wn, 1e-5)
    report["nccl_fallback"] = {"backend": comm.backend, "y": rel(to_np(y), ref_y),
                               "h": rel(to_np(h), ref_h), "hash": digest(y, h)}
    comm.close()


def check_tp_layer(comm, report, quick):
    """The TP2 layer graph (two ranks, Llama-2-7B sizes) against the single-GPU layer."""
    import cupy

    import fusionc as fc
    from fusionc.commands.compile import random_inputs
    from fusionc.models.blocks import attention_block, mlp_block
    from fusionc.models.tp import shard_layer
    from fusionc.runtime.transfer import download, upload
    sys.path.insert(0, "examples")
    import tp2_llama_layer
    sizes = dict(hidden=4096, heads=32, kv_heads=32, head_dim=128, intermediate=11008)
    S, batch = 1024, 4
    att = attention_block(max_seq=S, eps=1e-5, theta=1e4, dtype="f16",
                          **{k: v for k, v in sizes.items() if k != "intermediate"})
    mlp = mlp_block(hidden=4096, intermediate=11008, eps=1e-5, dtype="f16")
    rng = np.random.default_rng(11)
    ai = random_inputs(att.graphs[0], batch, rng, max_len=S)
    mi = random_inputs(mlp.graphs[0], batch, rng)
    single_a = fc.compile(att, max_batch=batch, kv_len=S)
    single_m = fc.compile(mlp, max_batch=batch, kv_len=S)
    ga, gm = att.graphs[0], mlp.graphs[0]
    dev_a = {p.name: upload(ai[p.name], p.type.dtype) for p in ga.params}
    h, kc, vc = single_a(**dev_a)
    dev_m = {p.name: upload(mi[p.name], p.type.dtype) for p in gm.params}
    dev_m["x"] = h
    (want,) = single_m(**dev_m)
    want = download(want, ga.params[0].type.dtype).astype(np.float64)
    module = tp2_llama_layer.build(max_seq=S)
    g = module.graphs[0]
    tp = fc.compile(module, "layer", max_batch=batch, kv_len=S, comm=comm)
    mine = shard_layer(ai, mi, comm.rank, comm.world, heads=32, kv_heads=32, head_dim=128,
                       intermediate=11008)
    dev = {p.name: upload(mine[p.name], p.type.dtype) for p in g.params}
    out, kr, vr = tp(**dev)
    cupy.cuda.Device().synchronize()
    comm.check()
    got = download(out, g.outputs[0].type.dtype)
    hk = 32 // comm.world
    kv_ok = bool(np.array_equal(download(kr, g.params[4].type.dtype),
                                download(kc, ga.params[4].type.dtype)[:, :, comm.rank * hk:
                                                                       (comm.rank + 1) * hk],
                                equal_nan=True))
    ref = fc.interpret(module, graph="layer", inputs=[shard_layer(ai, mi, r, comm.world, heads=32, kv_heads=32,
                                            head_dim=128, intermediate=11008)
                                for r in range(comm.world)], precise=True)[comm.rank][0] \
        if not quick else None
    report["tp_layer"] = {"vs_single_gpu": rel(got, want), "kv_cache_equal": kv_ok,
                          "vs_f64": rel(got, ref) if ref is not None else None,
                          "hash": hashlib.sha256(got.tobytes()).hexdigest()[:16]}


def compile_only() -> None:
    """Fill the cubin cache on a machine without a GPU with everything these checks and
    benchmarks/tp2.py launch."""
    import fusionc as fc
    from fusionc.comm.kernel import compile_spec, spec_for
    from fusionc.models.blocks import attention_block, mlp_block
    sys.path.insert(0, "examples")
    import tp2_llama_layer
    for dtype in ("f16", "bf16"):
        for world, two, res, norm in [(w, t, r, n) for w in (1, 2) for t in (False, True)
                                      for r, n in ((False, False), (True, False), (True, True))
                                      if not (w == 1 and t)]:
            for chunk in (1, 2, 4, 8):
                compile_spec(spec_for(world, D, dtype, res, norm, two, chunk=chunk))
    S, batch = 1024, 4
    fc.compile(attention_block(hidden=4096, heads=32, kv_heads=32, head_dim=128, max_seq=S,
                               eps=1e-5, theta=1e4, dtype="f16"), max_batch=batch, kv_len=S)
    fc.compile(mlp_block(hidden=4096, intermediate=11008, eps=1e-5, dtype="f16"),
               max_batch=batch, kv_len=S)
    fc.compile(tp2_llama_layer.build(max_seq=S), "layer", max_batch=batch, kv_len=S)
    import tp2_mlp   # fusionc run examples/tp2_mlp.py --batch 4 (default --kv-len 1024)
    fc.compile(tp2_mlp.build(), max_batch=batch, kv_len=1024)


def main() -> int:
    from tp2_split_check import check_split_tokens   # beside this script
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--only",
                    default="variants,back_to_back,failures,nccl,tp_layer,split_tokens")
    args = ap.parse_args()
    if args.compile_only:
        compile_only()
        return 0
    import torch
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    from fusionc.comm import Communicator
    report = {"rank": rank, "errors": []}
    comm = Communicator(ctas=16, max_bytes=8192 * D * 2)
    report["backend"] = comm.backend
    wide = Communicator(ctas=128, max_bytes=8192 * D * 2)
    steps = {"variants": lambda: (check_variants(comm, report, args.quick),
                                  check_variants(wide, report, args.quick)),
             "back_to_back": lambda: check_back_to_back(comm, report, args.quick),
             "failures": lambda: check_failures(report),
             "nccl": lambda: check_nccl_fallback(report),
             "tp_layer": lambda: check_tp_layer(comm, report, args.quick),
             "split_tokens": lambda: check_split_tokens(comm, report, args.quick)}
    for name in args.only.split(","):
        t0 = time.perf_counter()
        try:
            steps[name]()
        except Exception:  # noqa: BLE001 - recorded, the other checks still run
            report["errors"].append(f"{name}: {traceback.format_exc()[-3000:]}")
        report[f"{name}_seconds"] = round(time.perf_counter() - t0, 2)
        dist.barrier()
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out, f"rank{rank}.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in report if k.endswith("seconds") or k == "errors"}))
    comm.close()
    wide.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
