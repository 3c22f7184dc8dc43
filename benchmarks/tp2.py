"""Fused AllReduce + residual + RMSNorm over two GPUs (TP=2) against NCCL, hidden 4096, fp16.

    fusionc launch -n 2 -- python3 benchmarks/tp2.py [--tokens 1,8,...] [--ctas 8,16,32]

Columns, µs per call (CUDA graph of ``--calls`` calls, replayed ``--reps`` times; median replay
time / calls; rank 0's clock; both ranks interlock on every call): NCCL all-reduce alone; NCCL
all-reduce + add + RMSNorm as separate PyTorch ops (the baseline of issue 9: Hugging Face's
LlamaRMSNorm in fp32; ``unfused_F`` uses torch's rms_norm instead); fusionc one-shot
and two-shot at each CTA count; the best fusionc; its speedup over the baseline; the
peer-bandwidth floor = bytes each rank receives over NVLink (T · D · 2 for two ranks) / the peer
copy bandwidth measured in the same run (both GPUs copying into each other at once, as during an
all-reduce); fusionc / floor. NVLink multicast stays off (the launcher sets NCCL_NVLS_ENABLE=0).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

D = 4096


def time_calls(fn, calls: int, reps: int) -> float:
    """µs per call of ``fn`` (captured ``calls`` times in one CUDA graph)."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(calls):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(a.elapsed_time(b) for a, b in ev) / calls


def peer_bandwidth(comm, nbytes: int = 64 << 20) -> float:
    """Bytes/s one GPU receives while both copy ``nbytes`` into each other (copy engines)."""
    import cupy
    import torch
    peer = comm.bases[1 - comm.rank] + comm.flag_bytes
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)

    def copy():
        cupy.cuda.runtime.memcpyAsync(peer, src.data_ptr(), nbytes, 4,
                                      torch.cuda.current_stream().cuda_stream)
    return nbytes / (time_calls(copy, 5, 20) * 1e-6)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,8,32,128,512,1024,2048,4096,8192")
    ap.add_argument("--ctas", default="16,32,64,128")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", help="write the rows here (rank 0)")
    args = ap.parse_args()
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    from fusionc.comm import Communicator
    tokens = [int(t) for t in args.tokens.split(",")]
    max_bytes = max(tokens) * D * 2
    comms = {c: Communicator(ctas=c, max_bytes=max_bytes) for c in map(int, args.ctas.split(","))}
    bw = peer_bandwidth(next(iter(comms.values())))
    rows = []
    for T in tokens:
        g = torch.Generator(device="cuda").manual_seed(T + 100 * rank)
        x = torch.randn(T, D, device="cuda", dtype=torch.float16, generator=g)
        res = torch.randn(T, D, device="cuda", dtype=torch.float16,
                          generator=torch.Generator(device="cuda").manual_seed(T))
        w = 1 + 0.1 * torch.randn(D, device="cuda", dtype=torch.float16,
                                  generator=torch.Generator(device="cuda").manual_seed(1))
        buf, y, h = x.clone(), torch.empty_like(x), torch.empty_like(x)

        def nccl():
            buf.copy_(x)
            dist.all_reduce(buf)

        def unfused():   # Hugging Face's LlamaRMSNorm after the all-reduce and the add
            nccl()
            hs = (buf + res).float()
            hs = hs * torch.rsqrt(hs.pow(2).mean(-1, keepdim=True) + 1e-5)
            return w * hs.to(torch.float16)

        def unfused_fn():   # the same with PyTorch's own rms_norm
            nccl()
            return F.rms_norm(buf + res, (D,), w, 1e-5)
        row = {"tokens": T, "bytes": T * D * 2, "nccl": time_calls(nccl, args.calls, args.reps),
               "unfused": time_calls(unfused, args.calls, args.reps),
               "unfused_F": time_calls(unfused_fn, args.calls, args.reps)}
        for c, comm in comms.items():
            for algo in ("oneshot", "twoshot"):
                row[f"{algo}@{c}"] = time_calls(
                    lambda comm=comm, algo=algo: comm.all_reduce(x, res, w, 1e-5, out_y=y,
                                                                 out_h=h, algo=algo),
                    args.calls, args.reps)
        best = min((k for k in row if "@" in k), key=row.get)
        row.update(best=best, fusionc=row[best], speedup=row["unfused"] / row[best],
                   floor=T * D * 2 / bw * 1e6)
        row["x_floor"] = row["fusionc"] / row["floor"]
        rows.append(row)
    if rank == 0:
        print(f"peer copy bandwidth (both directions at once), per GPU received: {bw / 1e9:.0f} "
              "GB/s; µs per call")
        cols = ["tokens", "nccl", "unfused", "unfused_F"] + [k for k in rows[0] if "@" in k] + \
            ["best", "speedup", "floor", "x_floor"]
        print(" | ".join(cols))
        for r in rows:
            print(" | ".join(f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c])
                             for c in cols))
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps({"peer_bw": bw, "rows": rows}))
    for comm in comms.values():
        comm.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
