"""The token-split overlap step of ``scripts/tp2_check.py`` (issue 10): split vs unsplit,
sampled rows against the float64 interpreter over both ranks, many overlapped calls, and CUDA
graph replays of the split step."""
from __future__ import annotations

import hashlib
import sys
import time

import numpy as np

from tp2_check import rel


def check_split_tokens(comm, report, quick):
    """Token-split overlap (examples/tp2_mlp.py, the @o_proj graph of tp2_llama_layer.py):
    split vs unsplit outputs at odd and round token counts, sampled rows against the float64
    interpreter over both ranks, many overlapped calls without a hang, and a CUDA-graph
    replay if cuBLAS can be captured."""
    import cupy

    import fusionc as fc
    from fusionc.commands.compile import random_inputs
    from fusionc.runtime.transfer import download, upload
    sys.path.insert(0, "examples")
    import tp2_llama_layer
    import tp2_mlp
    out = {}
    graphs = {"mlp": tp2_mlp.build().graphs[0],
              "o_proj": tp2_llama_layer.build().graphs[1]}
    sharded = {"mlp": "w_down", "o_proj": "o"}   # differs per rank; the rest is replicated

    def rank_inputs(ins, name, r):
        return dict(ins, **{sharded[name]: ins[sharded[name]] * (1 + 0.5 * r)})
    for name, g in graphs.items():
        for T in ([1023, 2048] if quick else [1023, 1025, 2048, 4096]):
            rng = np.random.default_rng(T)   # the same on both ranks
            ins = random_inputs(g, T, rng)
            mine = rank_inputs(ins, name, comm.rank)
            dev = {p.name: upload(mine[p.name], p.type.dtype) for p in g.params}
            res = {}
            for parts in (1, 2):
                fn = fc.compile(g, max_batch=T, comm=comm, split_tokens=parts,
                                min_split_tokens=1000)
                res[parts] = [download(o, v.type.dtype) for o, v in zip(fn(**dev), g.outputs)]
                comm.check()
            rows = np.sort(rng.choice(T, 32, replace=False))
            sample = [{k: (v[rows] if k in ("x", "o") else v)
                       for k, v in rank_inputs(ins, name, r).items()}
                      for r in range(comm.world)]
            ref = fc.interpret(g, sample, precise=True)[comm.rank]
            out[f"{name}/{T}"] = {
                "split_vs_unsplit": max(rel(a, b) for a, b in zip(res[2], res[1])),
                "bitwise": all(np.array_equal(a, b, equal_nan=True)
                               for a, b in zip(res[2], res[1])),
                "vs_f64": max(rel(a[rows], r) for a, r in zip(res[2], ref)),
                "hash": hashlib.sha256(b"".join(a.tobytes() for a in res[2])).hexdigest()[:16]}
    g = graphs["mlp"]
    T = 2048
    ins = rank_inputs(random_inputs(g, T, np.random.default_rng(5)), "mlp", comm.rank)
    dev = {p.name: upload(ins[p.name], p.type.dtype) for p in g.params}
    fn = fc.compile(g, max_batch=T, comm=comm, split_tokens=2, min_split_tokens=1000)
    first = download(fn(**dev)[0], g.outputs[0].type.dtype)
    n, bad, t0 = (200 if quick else 1000), 0, time.perf_counter()
    for i in range(n):
        o = fn(**dev)[0]
        if i % 100 == 99:
            bad += int(not np.array_equal(download(o, g.outputs[0].type.dtype), first))
    cupy.cuda.Device().synchronize()
    comm.check()
    out["loop"] = {"calls": n, "mismatches": bad, "seconds": time.perf_counter() - t0}
    try:   # a CUDA graph of the split step on a CuPy stream (fork/join through events)
        sys.path.insert(0, "benchmarks")
        from tp2_overlap import capture
        graph, s, outs = capture(fn, dev)
        outs[0].fill(0)
        cupy.cuda.Device().synchronize()   # the poison lands before the replays
        for _ in range(100):
            graph.launch(s)
        s.synchronize()
        comm.check()
        out["graph"] = {"replays": 100, "equal": bool(np.array_equal(
            download(outs[0], g.outputs[0].type.dtype), first))}
    except Exception as e:  # noqa: BLE001 - recorded
        cupy.cuda.Device().synchronize()
        out["graph"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    report["split_tokens"] = out
