"""Host overhead of a ``fusionc.compile`` call on a machine without a GPU (issue 23): the Python
path of ``CompiledGraph.__call__`` against fake device arrays and a stubbed driver launch
(``benchmarks/cpu_fakes.py``), per call, for one-kernel graphs, a two-kernel graph, a linear
layer, a graph with collectives and a library-path graph of host ops (row kernels and a
cuBLAS GEMM, launched through the same fake driver). The figures are the Python
path only: no driver launch, no PyTorch C++ attribute costs (``benchmarks/host_overhead.py``
measures the real thing on the GPU).

    python3 benchmarks/host_overhead_cpu.py [--calls 10000] [--profile attention]

Prints a Markdown table (last); with ``--profile CASE`` first the cProfile of that case's calls
(torch arguments), sorted by own time.
"""
# no `from __future__ import annotations`: the DSL evaluates the annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import table  # noqa: E402  (importable without PyTorch)

# Llama-3-8B sizes (fusionc/models/blocks.py, examples/llama3_8b.py), fp16, KV 4096
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, MAX_SEQ = 4096, 32, 8, 128, 14336, 4096


def layer_graph(dtype="f16"):
    """Graph ``@layer``: the attention block then the MLP block (two kernels)."""
    import fusionc as fc
    T = fc.dtype(dtype)
    q, kvd = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    cache = T["B", MAX_SEQ, KV_HEADS, HEAD_DIM]

    @fc.graph
    def layer(x: T["B", HIDDEN], attn_norm: T[HIDDEN], w_qkv: T[q + 2 * kvd, HIDDEN],
              w_o: T[HIDDEN, q], k_cache: cache, v_cache: cache, positions: fc.i32["B"],
              seq_lens: fc.i32["B"], mlp_norm: T[HIDDEN], w_gate_up: T[2 * INTER, HIDDEN],
              w_down: T[HIDDEN, INTER]):
        h = fc.rms_norm(x, attn_norm, 1e-5)
        qq, k, v = fc.split(fc.linear(h, w_qkv), [q, kvd, kvd])
        qq = fc.rope(fc.split_heads(qq, HEADS), positions, 500000.0)
        k = fc.rope(fc.split_heads(k, KV_HEADS), positions, 500000.0)
        k_cache, v_cache = fc.kv_cache_append(k_cache, v_cache, k,
                                              fc.split_heads(v, KV_HEADS), positions)
        o = fc.decode_attention(qq, k_cache, v_cache, seq_lens, 1 / math.sqrt(HEAD_DIM))
        x2 = x + fc.linear(fc.merge_heads(o), w_o)
        g, u = fc.split(fc.linear(fc.rms_norm(x2, mlp_norm, 1e-5), w_gate_up), [INTER, INTER])
        return x2 + fc.linear(fc.silu_mul(g, u), w_down), k_cache, v_cache

    return layer


def linear_graph(dtype="f16"):
    """Graph ``@linear``: ``y = x · wᵀ`` (one GEMM)."""
    import fusionc as fc
    T = fc.dtype(dtype)

    @fc.graph
    def linear(x: T["B", HIDDEN], w: T[HIDDEN, HIDDEN]):
        return fc.linear(x, w)

    return linear


def host_ops_graph(dtype="f16"):
    """Graph ``@host_ops``: ``x + silu(rms_norm(x) · wᵀ)`` on the library path (an RMSNorm, a
    cuBLAS GEMM, SiLU and add: four host ops as row kernels and a GEMM, no fused kernel), hidden 1024."""
    import fusionc as fc
    T = fc.dtype(dtype)

    @fc.graph
    def host_ops(x: T["B", 1024], norm: T[1024], w: T[1024, 1024]):
        return x + fc.silu(fc.linear(fc.rms_norm(x, norm, 1e-5), w))

    return host_ops


def cases(batch: int = 1):
    """``{name: (module, compile keyword arguments)}`` of the measured graphs."""
    from fusionc.models.blocks import attention_block, mlp_block, tp_layer_block
    attn = attention_block(hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                           max_seq=MAX_SEQ, eps=1e-5, theta=500000.0, dtype="f16")
    tp = tp_layer_block(hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                        intermediate=INTER, tp=2, max_seq=MAX_SEQ, eps=1e-5, theta=500000.0,
                        dtype="f16")
    kv = dict(max_batch=batch, kv_len=MAX_SEQ)
    from fusionc.runtime.pipelines import v2_default_pipeline
    one = v2_default_pipeline(attn.graphs[0], batch).replace("}", ", attention_o=true}", 1)
    return {"attention": (attn, kv),
            "attention (one kernel, partition-units{attention_o})": (
                attn, dict(kv, pipeline=one)),
            "mlp": (mlp_block(hidden=HIDDEN, intermediate=INTER, eps=1e-5, dtype="f16"),
                    dict(max_batch=batch)),
            "layer (attention + MLP)": (layer_graph(), kv),
            "linear": (linear_graph(), dict(max_batch=batch, lowering="v2")),
            "host ops (library path)": (host_ops_graph(),
                                        dict(max_batch=batch, pipeline="fold-views,lower-library")),
            "tp2 layer (collectives)": (tp, kv)}


def compile_case(module, kw):
    """``fusionc.compile(module, **kw)``; without ``lowering`` when compile has no such
    keyword."""
    import fusionc
    try:
        return fusionc.compile(module, **kw)
    except TypeError:
        if "lowering" not in kw:
            raise
        return fusionc.compile(module, **{k: v for k, v in kw.items() if k != "lowering"})


def kernels_of(cg) -> int:
    """Kernel launches of one call."""
    return sum(op.name == "launch" for op in cg.host.body)


class FakeComm:
    """A communicator stand-in: two ranks, every all-reduce a no-op."""

    world = 2

    def all_reduce(self, *args, **kwargs):
        return None

    def side(self, ctas):
        return self


def fake_args(cg, batch: int, torch: bool) -> dict:
    """Fake device arguments for every parameter of ``cg`` at batch ``batch``."""
    from benchmarks.cpu_fakes import FakeTensor, fake_cupy_array
    from fusionc.runtime.arrays import _CUPY, _TORCH
    env = {"B": batch}
    out = {}
    for p in cg.host.params:
        shape = p.type.concrete(env)
        dt = p.type.dtype
        out[p.name] = FakeTensor(shape, _TORCH[dt]) if torch else fake_cupy_array(
            shape, _CUPY[dt])
    return out


def per_call_us(cg, args: dict, calls: int, rounds: int = 5) -> float:
    """µs of Python per call: ``calls`` back-to-back calls (after one warm-up call) in
    ``rounds`` rounds, the fastest round (the machine's other load only slows rounds down)."""
    cg(**args)
    n = max(calls // rounds, 1)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            cg(**args)
        best = min(best, time.perf_counter() - t)
    return best / n * 1e6


def profile(cg, args: dict, calls: int, top: int = 25) -> str:
    """cProfile of ``calls`` calls, sorted by own time."""
    import cProfile
    import io
    import pstats
    cg(**args)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        cg(**args)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()




def measure(name: str, cg, cu, args) -> list[dict]:
    """The table rows of case ``name`` (torch, then CuPy arguments); ``cu``: the fake driver."""
    if "collectives" in name:
        cg.comm = FakeComm()
    rows = []
    for torch in (True, False):
        a = fake_args(cg, args.batch, torch)
        if args.profile and args.profile == name.split()[0] and torch:
            print(f"## cProfile: {name}, {args.calls} calls, torch arguments")
            print(profile(cg, a, args.calls))
        n0 = cu.launches
        us = per_call_us(cg, a, args.calls)
        rows.append(dict(graph=name, args="torch" if torch else "cupy", kernels=kernels_of(cg),
                         host_ops=len(cg.host.body) - kernels_of(cg),
                         launches=round((cu.launches - n0) / (args.calls + 1)), us_per_call=us))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--profile", metavar="CASE", help="cProfile this case (torch arguments)")
    ap.add_argument("--only", metavar="CASE", help="measure this case only")
    args = ap.parse_args()
    from benchmarks import cpu_fakes
    from fusionc.runtime.compiled import CompiledGraph
    rows = []
    with cpu_fakes.fake_gpu() as cu:
        for name, (module, kw) in cases(args.batch).items():
            if args.only and args.only != name.split()[0]:
                continue
            cg = compile_case(module, kw)
            assert isinstance(cg, CompiledGraph)
            rows += measure(name, cg, cu, args)
    print(table(rows, ["graph", "args", "kernels", "host_ops", "launches", "us_per_call"]))


if __name__ == "__main__":
    main()
