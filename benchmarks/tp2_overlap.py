"""Token-split compute/communication overlap (issue 10) on two GPUs, fp16, Llama-2-7B TP=2:
the MLP block (examples/tp2_mlp.py: RMSNorm → gate/up GEMM → SiLU·mul → down GEMM →
all-reduce + residual) and the O projection with its fused all-reduce + residual + RMSNorm
(the @o_proj graph of examples/tp2_llama_layer.py), at 512–8192 tokens.

    fusionc launch -n 2 -- python3 benchmarks/tp2_overlap.py [--tokens 512,1024,...]

Columns, ms per call (each variant captured once in a CUDA graph on a CuPy stream — the
Python dispatch of the host ops would otherwise dominate — and replayed; CUDA events around
each replay, median of --reps after warm-up; the ranks interlock on every all-reduce; rank 0's
clock): no overlap (``split_tokens=1``: GEMMs, then
the all-reduce on 128 CTAs), split-overlap with 2 and 4 blocks (each block's all-reduce but the
last on a side stream with --side-ctas CTAs, beside the next block's GEMMs), and the same
computation with the communication removed (``collective=False``: a local residual add).
GEMMs are cuBLAS (pass ``lower-library``) in every column.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))


def capture(fn, dev):
    """(graph, stream, outputs): ``fn(**dev)`` captured on a new CuPy stream after a warm-up
    call there (cuBLAS handle, side communicator); the compiled graph keeps the buffers that
    the capture allocated."""
    import cupy
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        fn(**dev)
        s.synchronize()
        s.begin_capture()
        outs = fn(**dev)
        graph = s.end_capture()
    return graph, s, outs


def time_call(fn, dev, reps: int) -> float:
    """ms per call: CUDA-graph replays with CUDA events around each, median."""
    import cupy
    graph, s, _ = capture(fn, dev)
    for _ in range(3):
        graph.launch(s)
    s.synchronize()
    ts = []
    for _ in range(reps):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record(s)
        graph.launch(s)
        b.record(s)
        b.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(a, b))
    return statistics.median(ts)


def graphs(collective: bool) -> dict:
    import tp2_llama_layer
    import tp2_mlp
    return {"mlp": tp2_mlp.build(collective=collective).graphs[0],
            "o_proj": tp2_llama_layer.build(collective=collective).graphs[1]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="512,1024,2048,4096,8192")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--side-ctas", type=int, default=32)
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy
    import numpy as np

    import fusionc as fc
    from fusionc.comm import Communicator
    from fusionc.commands.compile import random_inputs
    from fusionc.runtime.transfer import upload
    rank = int(os.environ["RANK"])
    cupy.cuda.Device(int(os.environ.get("LOCAL_RANK", rank))).use()
    tokens = [int(t) for t in args.tokens.split(",")]
    comm = Communicator(ctas=128, max_bytes=max(tokens) * 4096 * 2)
    with_comm, without = graphs(True), graphs(False)
    rows = []
    for name, g in with_comm.items():
        for T in tokens:
            ins = random_inputs(g, T, np.random.default_rng(T))
            dev = {p.name: upload(ins[p.name], p.type.dtype) for p in g.params}
            row = {"graph": name, "tokens": T}
            for parts in (1, 2, 4):
                fn = fc.compile(g, max_batch=T, comm=comm, split_tokens=parts,
                                min_split_tokens=0, side_ctas=args.side_ctas)
                row[f"split{parts}"] = time_call(fn, dev, args.reps)
            local = fc.compile(without[name], max_batch=T, split_tokens=1)
            row["no_comm"] = time_call(local, dev, args.reps)
            comm.check()
            best = min(row["split2"], row["split4"])
            row.update(vs_no_overlap=best / row["split1"], vs_no_comm=best / row["no_comm"])
            rows.append(row)
            comm.group.barrier()
    if rank == 0:
        cols = ["graph", "tokens", "split1", "split2", "split4", "no_comm", "vs_no_overlap",
                "vs_no_comm"]
        print(" | ".join(cols))
        for r in rows:
            print(" | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c])
                             for c in cols))
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(rows))
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
