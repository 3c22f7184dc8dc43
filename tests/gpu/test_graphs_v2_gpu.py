"""Graphs of norm / linear / elementwise ops on design v2 (``examples/graphs_v2.py``) on the GPU:
each against the float64 interpreter on fresh random inputs, outputs poisoned first. Covers the
MLP block (RMSNorm prologue, paired gate/up tiles with the SwiGLU epilogue, the residual
epilogue) at batch 1–16 in f16 and bf16, an intermediate size that is no multiple of 1024, the
plain-load path (rows TMA cannot copy), separate gate/up weights (silu and mul epilogues), a
bias + cast chain, and 200 CUDA-graph replays of the MLP."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import pathlib

import numpy as np
import pytest

import fusionc as fc
from fusionc.interp import interpret
from fusionc.interp.numerics import round_to
from fusionc.ir import DType
from tests.gpu.common import record, rel

pytestmark = pytest.mark.gpu
EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "graphs_v2.py"

# (graph, hidden, inter, dtype, batch, max_batch)
CASES = [("mlp", 4096, 11008, "f16", 1, 1), ("mlp", 4096, 14336, "bf16", 3, 4),
         ("mlp", 4096, 14336, "bf16", 16, 16), ("mlp", 2048, 5504, "f16", 8, 8),
         ("mlp", 1003, 500, "f16", 3, 4), ("mlp", 512, 1000, "f32", 2, 2),
         ("swiglu", 4096, 11008, "bf16", 4, 4), ("norm_silu", 3072, 8192, "f16", 2, 2),
         ("mlp_shard", 4096, 7168, "bf16", 5, 8), ("chain", 2048, 1000, "f16", 3, 4)]


def _module(case):
    from fusionc.dsl.loader import load_file
    name, hidden, inter, dt, _, _ = case
    return load_file(str(EXAMPLE), hidden=hidden, inter=inter, dtype=dt)


def compiled(case):
    return fc.compile(_module(case), case[0], max_batch=case[5], lowering="v2")


def precompile():
    for case in CASES:
        compiled(case)


def _inputs(g, case, rng):
    d, batch = DType(case[3]), case[4]
    out = {}
    for p in g.params:
        shape = tuple(batch if isinstance(s, str) else s for s in p.type.shape)
        a = rng.standard_normal(shape)
        if "norm" in p.name or p.name == "g":
            a = 1 + 0.2 * a
        elif p.name.startswith("w"):
            a = a / np.sqrt(shape[-1])
        out[p.name] = np.asarray(round_to(a, p.type.dtype), np.float64)
    return out


def _run(fn, g, args, dt):
    import cupy
    from fusionc.runtime.transfer import download, nan_bits, upload
    dev = {a: upload(v, next(p.type.dtype for p in g.params if p.name == a))
           for a, v in args.items()}
    o = g.outputs[0]
    shape = tuple(args[next(iter(args))].shape[0] if isinstance(s, str) else s
                  for s in o.type.shape)
    y = upload(np.zeros(shape), o.type.dtype)
    y.fill(nan_bits(o.type.dtype))   # poisoned: every element must be written
    fn(**dev, outputs={o.name: y})
    cupy.cuda.get_current_stream().synchronize()
    return download(y, o.type.dtype), dev, y


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_graph_v2_against_float64(case):
    m = _module(case)
    g = m[case[0]]
    fn = compiled(case)
    args = _inputs(g, case, np.random.default_rng())
    ref, = interpret(m, args, graph=case[0], precise=True)
    out, _, _ = _run(fn, g, args, case[3])
    err = rel(out, ref)
    loaded = list(fn._loaded.values())
    record("graphs v2", "-".join(map(str, case)), f"{err:.1e}, {len(loaded)} kernels")
    assert np.isfinite(out).all() and err <= (1e-4 if case[3] == "f32" else 1e-2)
    assert all(lk.errors() == 0 and int(lk.counters.sum()) == 0 for lk in loaded)


def test_mlp_v2_graph_replays():
    """The MLP (two kernels under programmatic dependent launch) replayed 200 times in a CUDA
    graph on one set of buffers: the result stays right and the counters reset themselves."""
    import cupy
    from fusionc.runtime.transfer import download, nan_bits
    case = CASES[1]
    m = _module(case)
    g = m["mlp"]
    fn = compiled(case)
    args = _inputs(g, case, np.random.default_rng())
    ref, = interpret(m, args, graph="mlp", precise=True)
    _, dev, y = _run(fn, g, args, case[3])
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        fn(**dev, outputs={g.outputs[0].name: y})
        graph = stream.end_capture()
        y.fill(nan_bits(DType(case[3])))
        for _ in range(200):
            graph.launch(stream)
        stream.synchronize()
    err = rel(download(y, DType(case[3])), ref)
    loaded = list(fn._loaded.values())
    record("graphs v2", "mlp: 200 graph replays", f"{err:.1e}")
    assert err <= 1e-2
    assert all(lk.errors() == 0 and int(lk.counters.sum()) == 0 for lk in loaded)
