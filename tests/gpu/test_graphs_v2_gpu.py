"""Graphs of norm / linear / elementwise ops on design v2 (``examples/graphs_v2.py``) on the GPU:
each against the float64 interpreter on fresh random inputs, outputs poisoned first. Covers the
MLP block (RMSNorm prologue, paired gate/up tiles with the SwiGLU epilogue, the residual
epilogue) at batch 1–16 in f16 and bf16, an intermediate size that is no multiple of 1024, the
plain-load path (rows TMA cannot copy), separate gate/up weights (silu and mul epilogues), a
bias + cast chain, views folded away (split_heads → SiLU → merge_heads), batch 17–128 on tensor cores (wgmma), the library path above the fused
kernels' batch bucket (129–256 rows; 17 and 32 on the FMA paths), and 200 CUDA-graph replays of the MLP. Chained linears (the MLP's gate/up
then down, ``@chain``) run as the phases of one persistent kernel wherever every row can be
copied by TMA, also on grids of 1 and 5 CTAs."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import pathlib

import numpy as np
import pytest

import fusionc as fc
from fusionc.interp import interpret
from fusionc.interp.numerics import round_to
from fusionc.ir import DType
from tests.gpu.common import record, rel, torch_capture

pytestmark = pytest.mark.gpu
EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "graphs_v2.py"

# (graph, hidden, inter, dtype, batch, max_batch)
CASES = [("mlp", 4096, 11008, "f16", 1, 1), ("mlp", 4096, 14336, "bf16", 3, 4),
         ("mlp", 4096, 14336, "bf16", 16, 16), ("mlp", 2048, 5504, "f16", 8, 8),
         ("mlp", 1003, 500, "f16", 3, 4), ("mlp", 512, 1000, "f32", 2, 2),
         ("swiglu", 4096, 11008, "bf16", 4, 4), ("norm_silu", 3072, 8192, "f16", 2, 2),
         ("mlp_shard", 4096, 7168, "bf16", 5, 8), ("chain", 2048, 1000, "f16", 3, 4),
         ("mlp", 2048, 5504, "f16", 17, 32), ("mlp", 4096, 14336, "bf16", 33, 64),
         ("mlp", 4096, 11008, "f16", 64, 64), ("swiglu", 3072, 8200, "bf16", 48, 64),
         ("chain", 2048, 1000, "f16", 64, 64), ("mlp", 4096, 11008, "f16", 100, 128),
         ("swiglu", 4096, 11008, "bf16", 128, 128), ("chain", 2048, 1000, "f16", 65, 128),
         ("heads", 4096, 11008, "f16", 4, 4), ("heads", 2048, 1000, "bf16", 40, 64)]
# above the fused kernels' batch bucket (fused_rows: 128 rows on tensor cores, 16 on the FMA
# paths) fusionc.compile takes the library path (cuBLAS GEMMs, row kernels)
LIB_CASES = [("mlp", 4096, 11008, "f16", 160, 160), ("mlp", 4096, 14336, "bf16", 255, 255),
             ("mlp", 4096, 14336, "f16", 256, 256), ("swiglu", 4096, 11008, "bf16", 129, 129),
             ("chain", 2048, 1000, "f16", 129, 129), ("mlp", 1003, 500, "f16", 32, 32),
             ("mlp_shard", 4096, 7168, "bf16", 200, 200), ("norm_silu", 3072, 8192, "f32", 17, 17)]
# 128 weight rows per tile (partition-units{rows=128}: each activation box serves two warpgroups)
WIDE_CASES = [("mlp", 4096, 11008, "f16", 1, 1), ("mlp", 4096, 14336, "bf16", 16, 16),
              ("swiglu", 3072, 8200, "bf16", 48, 64), ("mlp", 4096, 11008, "f16", 100, 128),
              ("chain", 2048, 1000, "f16", 65, 128), ("mlp_shard", 4096, 7168, "bf16", 5, 8),
              ("norm_silu", 3072, 8192, "f16", 32, 32), ("heads", 4096, 14336, "bf16", 16, 16)]


def _module(case):
    from fusionc.dsl.loader import load_file
    name, hidden, inter, dt, _, _ = case
    return load_file(str(EXAMPLE), hidden=hidden, inter=inter, dtype=dt)


def compiled(case, chain=True, rows=64):
    """The case on lowering v2; ``chain``: chained linears in one kernel of phases (True) or
    one kernel each (False), whatever the default picks for the batch; ``rows``: weight rows
    per tile."""
    from fusionc.passes.stream import v2_pipeline
    return fc.compile(_module(case), case[0], max_batch=case[5], lowering="v2",
                      pipeline=v2_pipeline(case[5], chain=chain, rows=rows))


def precompile():
    for case in CASES:
        for chain in (True, False):
            compiled(case, chain)
    for case in LIB_CASES:
        compiled_default(case)
    for case in WIDE_CASES:
        compiled(case, rows=128)


def compiled_default(case):
    """The case on lowering v2 with its default pipeline."""
    return fc.compile(_module(case), case[0], max_batch=case[5], lowering="v2")


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


@pytest.mark.parametrize("chain", [True, False], ids=["chained", "unchained"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_graph_v2_against_float64(case, chain):
    m = _module(case)
    g = m[case[0]]
    fn = compiled(case, chain)
    args = _inputs(g, case, np.random.default_rng())
    ref, = interpret(m, args, graph=case[0], precise=True)
    out, _, _ = _run(fn, g, args, case[3])
    err = rel(out, ref)
    loaded = list(fn._loaded.values())
    record("graphs v2", "-".join(map(str, case)) + ("" if chain else " unchained"),
           f"{err:.1e}, {len(loaded)} kernels")
    assert np.isfinite(out).all() and err <= (1e-4 if case[3] == "f32" else 1e-2)
    assert len(loaded) == _kernels(case, chain)
    assert all(lk.errors() == 0 and int(lk.counters.sum()) == 0 for lk in loaded)


@pytest.mark.parametrize("case", WIDE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_graph_v2_wide_tiles_against_float64(case):
    """128 weight rows per tile: warpgroup w takes rows 64w..64w+63 of the tile over both K
    halves of every activation box."""
    m = _module(case)
    g = m[case[0]]
    fn = compiled(case, rows=128)
    args = _inputs(g, case, np.random.default_rng())
    ref, = interpret(m, args, graph=case[0], precise=True)
    out, _, _ = _run(fn, g, args, case[3])
    err = rel(out, ref)
    loaded = list(fn._loaded.values())
    record("graphs v2", "-".join(map(str, case)) + " rows=128", f"{err:.1e}")
    assert np.isfinite(out).all() and err <= 1e-2
    assert len(loaded) == _kernels(case, True)
    assert all(lk.errors() == 0 and int(lk.counters.sum()) == 0 for lk in loaded)


@pytest.mark.parametrize("case", LIB_CASES, ids=lambda c: "-".join(map(str, c)))
def test_graph_v2_library_path_against_float64(case):
    """Past the fused batch bucket: GEMMs (with the bias), RMSNorm, SiLU, SiLU·mul, mul, add and
    cast as library calls, rounded per op like the interpreter."""
    m = _module(case)
    g = m[case[0]]
    fn = compiled_default(case)
    assert not fn.kernels and any(op.name == "library_call" for op in fn.host.body)
    args = _inputs(g, case, np.random.default_rng())
    ref, = interpret(m, args, graph=case[0], precise=True)
    out, _, _ = _run(fn, g, args, case[3])
    err = rel(out, ref)
    record("graphs v2", "-".join(map(str, case)) + " library", f"{err:.1e}")
    assert np.isfinite(out).all() and err <= (1e-4 if case[3] == "f32" else 1e-2)


def _kernels(case, chain) -> int:
    """Kernels of a case: chained linears share one when every weight row is TMA-copyable."""
    name, hidden, inter, dt = case[:4]
    item = DType(dt).itemsize
    ring = chain and hidden * item % 16 == 0 and inter * item % 16 == 0
    return {"mlp": 1 if ring else 2, "mlp_shard": 1 if ring else 2, "chain": 1 if ring else 2,
            "heads": 1 if ring else 2, "swiglu": 2, "norm_silu": 1}[name]


def _mlp():
    """The bf16 MLP at 3 rows in one persistent kernel: (case, graph, callable, inputs, the
    float64 reference)."""
    case = CASES[1]
    m = _module(case)
    g = m["mlp"]
    args = _inputs(g, case, np.random.default_rng())
    ref, = interpret(m, args, graph="mlp", precise=True)
    return case, g, compiled(case), args, ref


@pytest.mark.parametrize("grid", [1, 5])
def test_mlp_v2_on_small_grids(grid):
    """One persistent MLP kernel on fewer CTAs than units: each CTA runs many gate/up units,
    then many down units that wait on the other CTAs' chunks."""
    case, g, fn, args, ref = _mlp()
    _run(fn, g, args, case[3])   # loads the kernel
    lk, = fn._loaded.values()
    lk.grid = grid
    out, _, _ = _run(fn, g, args, case[3])
    err = rel(out, ref)
    record("graphs v2", f"mlp on {grid} CTAs", f"{err:.1e}")
    assert err <= 1e-2 and lk.errors() == 0 and int(lk.counters.sum()) == 0


def test_mlp_v2_graph_replays():
    """The MLP (one persistent kernel: gate/up units, per-chunk counters, down units) replayed
    200 times in a CUDA graph on one set of buffers: the result stays right and the counters
    reset themselves."""
    import cupy
    from fusionc.runtime.transfer import download, nan_bits
    case, g, fn, args, ref = _mlp()
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


def test_library_path_captured_in_a_torch_cuda_graph():
    """The library path (RMSNorm's sums of squares, GEMMs with a bias, elementwise kernels)
    under torch.cuda.graph: every buffer from PyTorch's capture-aware allocator, replays equal
    to the eager call."""
    torch = pytest.importorskip("torch")
    case = ("mlp", 4096, 11008, "bf16", 128, 128)
    m = _module(case)
    g = m["mlp"]
    fn = compiled_default(case)
    args = _inputs(g, case, np.random.default_rng(7))
    t = {k: torch.tensor(v, dtype=torch.float32).to(torch.bfloat16).cuda()
         for k, v in args.items()}
    eager, captured = torch_capture(fn, t, poison=True)
    record("graphs v2", "library path in a torch CUDA graph", "ok")
    assert torch.equal(captured, eager)
