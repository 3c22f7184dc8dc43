"""The autotuning search: every candidate choice is compiled (through the cubin cache) and timed
on the GPU by CUDA-graph replay over buffer sets larger than 3x L2; the fastest is stored. It
varies lowering v2's path (:class:`V2Choice`: fused 64-row tiles one kernel per linear or
chained, fused 128-row tiles, the library path, the mixed path) and, for an attention block on
a fused path, whether the block is one kernel (``partition-units{attention_o}``)."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from fusionc.ir.nodes import Graph

L2_BYTES = 60 * 1024 * 1024


V2_PATHS = ("fused", "wide", "library", "mixed")   # mixed: GEMMs around attention units


@dataclass(frozen=True)
class V2Choice:
    """Lowering v2's choice: ``path`` one of :data:`V2_PATHS` (as
    ``fusionc.cost.h200.Device.v2_path``), ``chain``: chained linears in one kernel,
    ``fuse``: an attention block in one kernel (the fused paths:
    :func:`fusionc.lower.attention_o.fused_attention`)."""

    path: str
    chain: bool
    fuse: bool = False

    def compile_kwargs(self, g: Graph, max_batch: int) -> dict:
        """Keyword arguments of fusionc.compile that realize this choice for ``g``."""
        from fusionc.runtime.pipelines import path_pipeline
        return dict(lowering="v2", pipeline=path_pipeline(g, max_batch, self.path, self.chain,
                                                          self.fuse))

    def describe(self) -> str:
        return self.path + (" chained" if self.chain and self.path != "library" else "") + \
            (", attention block in one kernel" if self.fuse else "")


def candidates(g: Graph | None = None, max_batch: int = 1) -> list:
    """The paths that can realize ``g`` at ``max_batch`` rows: fused up to its bucket, 128-row
    tiles where every linear is on tensor cores, the library path unless the graph attends (an
    attending graph has the mixed path instead, GEMMs around attention units, and only it where
    the units do not take the attention: its host attention)."""
    from fusionc.lower.linear_v2 import MAX_BATCH_MMA, fused_rows
    top = fused_rows(g) if g is not None else None
    out = []
    if g is not None:
        from fusionc.runtime.pipelines import first_passes, host_attention
        if host_attention(first_passes(g)):   # the units do not take it: the host path only
            top = None
    attends = g is not None and any(op.name == "decode_attention" for op in g.body)
    if top is not None and max_batch <= top:
        out += [V2Choice("fused", False), V2Choice("fused", True)]
        if top == MAX_BATCH_MMA:
            out.append(V2Choice("wide", True))
        if attends:   # each fused path with its attention blocks in one kernel
            out += [V2Choice(c.path, c.chain, True) for c in out]
    if attends:
        from fusionc.runtime.pipelines import first_passes
        from fusionc.runtime.pipelines import mixed
        return out + ([V2Choice("mixed", False)] if mixed(first_passes(g)) else [])
    return out + [V2Choice("library", False)]


def compile_candidates(g: Graph, max_batch: int, kv_len: int, progress: bool = True):
    """(choice, compiled) for every candidate that lowers and fits (no GPU needed).

    Raises:
        LoweringError: no candidate compiles (naming the first candidate's error).
    """
    import fusionc
    from fusionc.errors import FusionError, LoweringError
    from tqdm import tqdm
    out, errors = [], []
    cands = candidates(g, max_batch)
    for ch in tqdm(cands, desc=f"compiling @{g.name}", disable=not progress):
        kw = ch.compile_kwargs(g, max_batch)
        try:
            out.append((ch, fusionc.compile(g, max_batch=max_batch, kv_len=kv_len, **kw)))
        except FusionError as e:
            errors.append(e)  # this choice cannot realize the graph (sizes, shared memory)
    if not out:
        raise LoweringError(f"no candidate of the autotuning search compiles at batch "
                            f"{max_batch}, KV length {kv_len}; the first "
                            f"({cands[0] if cands else 'none'}): "
                            f"{errors[0].message if errors else 'none'}", op=g.name,
                            loc=errors[0].loc if errors else g.loc,
                            valid=(errors[0].valid or "") + "; or a smaller --batch / sizes")
    return out


def autotune(g: Graph, max_batch: int, kv_len: int, *, reps: int = 20,
             progress: bool = True, store: bool = True):
    """Measure every candidate on the current GPU; store and return the fastest.

    Returns ``(best choice, [(choice, µs), ...])``. Raises DeviceError without a GPU.
    """
    from fusionc.runtime.arrays import require_gpu
    from fusionc.tune import store as st
    from tqdm import tqdm
    require_gpu()
    compiled = compile_candidates(g, max_batch, kv_len, progress)
    sets = _buffer_sets(g, max_batch, kv_len)
    results = []
    outs = [_outputs(g, s) for s in sets]
    for ch, fn in tqdm(compiled, desc=f"timing @{g.name}", disable=not progress):
        results.append((ch, _time(fn, sets, outs, reps)))
    best, us = min(results, key=lambda r: r[1])
    if store:
        choice = {k: v for k, v in asdict(best).items() if k != "fuse" or v}   # as before
        st.record(g, max_batch, kv_len, {**choice, "us": round(us, 2),
                                         "candidates": len(results)})
    return best, results


def _buffer_sets(g: Graph, batch: int, kv_len: int) -> list[dict]:
    """Random device inputs, as many sets as needed to exceed 3x L2."""
    import numpy as np
    from fusionc.commands.compile import random_inputs
    from fusionc.runtime.transfer import upload
    rng = np.random.default_rng(0)
    one = random_inputs(g, batch, rng, max_len=kv_len)
    nbytes = sum(p.type.nbytes({d: batch for d in p.type.shape if isinstance(d, str)})
                 for p in g.params)
    n = max(2, math.ceil(3 * L2_BYTES / max(nbytes, 1)))
    return [{p.name: upload(one[p.name], p.type.dtype) for p in g.params} for _ in range(n)]


def _outputs(g: Graph, s: dict) -> dict:
    """Pre-allocated buffers for the graph's new outputs (nothing is allocated in a capture)."""
    import cupy
    from fusionc.runtime.arrays import _CUPY
    params = {p.name for p in g.params}
    env = {d: n for p in g.params for d, n in zip(p.type.shape, s[p.name].shape)
           if isinstance(d, str)}
    return {v.name: cupy.empty(v.type.concrete(env), _CUPY[v.type.dtype])
            for v in g.outputs if v.name not in params}


def _time(fn, sets: list[dict], outs: list[dict], reps: int) -> float:
    """µs per call: one CUDA graph calls ``fn`` once per buffer set; median replay / sets."""
    import cupy
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for s, o in zip(sets, outs):
            fn(**s, outputs=o)  # loads the module, warms up
        stream.synchronize()
        stream.begin_capture()
        for s, o in zip(sets, outs):
            fn(**s, outputs=o)
        graph = stream.end_capture()
        graph.launch()
        times = []
        for _ in range(reps):
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record(stream)
            graph.launch()
            b.record(stream)
            b.synchronize()
            times.append(cupy.cuda.get_elapsed_time(a, b) * 1e3 / len(sets))
    return statistics.median(times)
