"""The design-v2 linear layer on the GPU (``lowering="v2"``): a streamed persistent kernel
against a float64 reference on fresh random inputs, outputs poisoned first. Covers the FMA path
(1 row, f32), tensor cores (wgmma at 1–128 rows; mma.sync under FUSIONC_MMA=sync, f16/bf16), K
tails (a half k-step, K below one tile), N tails, the plain-load path (rows TMA cannot copy), a bias, 1000 CUDA-graph
replays with self-resetting counters, and a grid larger than the GPU holds at once."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import pathlib

import numpy as np
import pytest

import fusionc as fc
from tests.passes.graphs import linear_graph
from fusionc.interp.numerics import round_to
from fusionc.ir import DType
from fusionc.runtime.transfer import nan_bits
from tests.gpu.common import record, rel

pytestmark = pytest.mark.gpu

# (N, K, dtype, batch, max_batch, bias)
CASES = [(4096, 4096, "f16", 1, 1, False), (4096, 4096, "bf16", 3, 4, True),
         (1000, 4104, "f16", 16, 16, False), (200, 520, "f32", 3, 4, True),
         (300, 1003, "f16", 5, 8, False), (4096, 11008, "f16", 2, 2, False),
         (6144, 4096, "bf16", 9, 16, True), (64, 64, "f16", 1, 1, False),
         (2048, 4096, "bf16", 1, 1, True), (1000, 4104, "f16", 40, 64, True),
         (14336, 4096, "bf16", 64, 64, False), (4096, 11008, "f16", 25, 32, False),
         (4096, 4096, "bf16", 128, 128, True), (300, 1003, "f16", 20, 20, True)]


# 128 weight rows per tile (partition-units{rows=128})
WIDE_CASES = [(4096, 4096, "f16", 1, 1, False), (4096, 4096, "bf16", 128, 128, True),
              (1000, 4104, "f16", 40, 64, True), (14336, 4096, "bf16", 64, 64, False),
              (200, 520, "f16", 3, 4, True)]


def wide(case):
    from fusionc.passes.stream import v2_pipeline
    return v2_pipeline(case[4], rows=128)


def compiled(case, pipeline=None):
    n, k, dt, _, mb, bias = case
    return fc.compile(linear_graph(n, k, dt, bias), max_batch=mb, lowering="v2",
                      pipeline=pipeline)


def precompile():
    for case in CASES:
        compiled(case)
    for case in WIDE_CASES:
        compiled(case, wide(case))
    compiled(GRAPH_CASE)
    compiled(WAVES_CASE, WAVES_PIPELINE)
    chain_compiled()


def _inputs(case, rng):
    n, k, dt, batch, _, bias = case
    d = DType(dt)
    args = {"x": rng.standard_normal((batch, k)), "w": rng.standard_normal((n, k)) / np.sqrt(k)}
    if bias:
        args["b"] = rng.standard_normal(n)
    args = {a: np.asarray(round_to(v, d), np.float64) for a, v in args.items()}
    ref = args["x"] @ args["w"].T + (args["b"] if bias else 0)
    return args, ref


def _call(fn, case, args):
    from fusionc.runtime.transfer import download, nan_bits, upload
    import cupy
    n, _, dt, batch, _, _ = case
    d = DType(dt)
    dev = {a: upload(v, d) for a, v in args.items()}
    y = cupy.empty((batch, n), dev["x"].dtype)
    y.fill(nan_bits(d))
    fn(**dev, outputs={"y": y})
    cupy.cuda.get_current_stream().synchronize()
    return download(y, d), dev, y


def _tol(dt):
    return 1e-4 if dt == "f32" else 1e-2


@pytest.mark.parametrize("case, tiles", [(c, "default") for c in CASES] +
                         [(c, "rows=128") for c in WIDE_CASES],
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else c)
def test_linear_v2_against_float64(case, tiles):
    """The default pipeline (128-row tiles at 1-32 rows, cuBLAS from 33 rows), and 128-row
    tiles forced up to 128 rows."""
    fn = compiled(case, None if tiles == "default" else wide(case))
    args, ref = _inputs(case, np.random.default_rng())
    out, _, _ = _call(fn, case, args)
    err = rel(out, ref)
    assert np.isfinite(out).all() and err <= _tol(case[2])
    if not fn.kernels:   # past the fused batch bucket: a cuBLAS GEMM with the bias
        record("linear v2", "x".join(map(str, case)), f"{err:.1e}, library path")
        return
    lk = next(iter(fn._loaded.values()))
    record("linear v2", "x".join(map(str, case)) + f" {tiles}", f"{err:.1e} on {lk.grid} CTAs")
    assert lk.errors() == 0
    assert int(lk.counters.sum()) == 0   # self-resetting


GRAPH_CASE = (4096, 4096, "f16", 4, 4, False)


def test_linear_v2_graph_replays_reset_counters():
    import cupy
    fn = compiled(GRAPH_CASE)
    args, ref = _inputs(GRAPH_CASE, np.random.default_rng())
    out, dev, y = _call(fn, GRAPH_CASE, args)   # loads the kernel before the capture
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        fn(**dev, outputs={"y": y})
        graph = stream.end_capture()
        y.fill(nan_bits(DType.f16))
        for _ in range(1000):
            graph.launch(stream)
        stream.synchronize()
    from fusionc.runtime.transfer import download
    err = rel(download(y, DType.f16), ref)
    lk = next(iter(fn._loaded.values()))
    record("linear v2", "1000 graph replays", f"{err:.1e}")
    assert err <= 1e-2 and int(lk.counters.sum()) == 0 and lk.errors() == 0


WAVES_CASE = (2048, 4096, "f16", 2, 2, True)
WAVES_PIPELINE = "partition-units{max_batch=2,grid=1024},stream-plan,insert-barriers,smem-plan"


def test_linear_v2_grid_larger_than_the_gpu_holds():
    """1024 CTAs of one per SM (8 waves on 132 SMs): CTAs that start late must not hang the
    ones that started (no CTA waits for another) and the split-K sums stay exact."""
    from fusionc.runtime.launch import persistent_grid
    fn = compiled(WAVES_CASE, WAVES_PIPELINE)
    args, ref = _inputs(WAVES_CASE, np.random.default_rng())
    _call(fn, WAVES_CASE, args)
    lk = next(iter(fn._loaded.values()))
    lk.grid = persistent_grid(lk.compiled.source, lk.function, override=1024)
    out, _, _ = _call(fn, WAVES_CASE, args)
    err = rel(out, ref)
    record("linear v2", "1024 CTAs (not all resident)", f"{err:.1e}")
    assert lk.grid == 1024 and err <= 1e-2 and int(lk.counters.sum()) == 0


CHAIN = (1024, 4096, 512, "f16", 4)   # x [B, 4096] -> h [B, 1024] -> y [B, 512]


def chain_compiled():
    from fusionc.dsl.loader import load_file
    n, k, n2, dt, mb = CHAIN
    m = load_file(str(pathlib.Path(__file__).parents[2] / "examples" / "linear_v2.py"),
                  n=n, k=k, n2=n2, dtype=dt)
    return m["chain"], fc.compile(m, "chain", max_batch=mb, lowering="v2")


def test_linear_v2_chain_under_pdl_in_a_graph():
    """Two streamed kernels, the second reading the first's output, launched with programmatic
    dependent launch and replayed 200 times in a CUDA graph: the second may start while the
    first drains but reads h only after griddepcontrol.wait."""
    import cupy
    from fusionc.runtime.transfer import download, upload
    g, fn = chain_compiled()
    n, k, n2, dt, mb = CHAIN
    rng = np.random.default_rng()
    d = DType(dt)
    args = {"x": rng.standard_normal((mb, k)), "w1": rng.standard_normal((n, k)) / np.sqrt(k),
            "w2": rng.standard_normal((n2, n)) / np.sqrt(n)}
    args = {a: np.asarray(round_to(v, d), np.float64) for a, v in args.items()}
    h = np.asarray(round_to(args["x"] @ args["w1"].T, d), np.float64)
    ref = h @ args["w2"].T
    dev = {a: upload(v, d) for a, v in args.items()}
    y = cupy.empty((mb, n2), dev["x"].dtype)
    fn(**dev, outputs={"y": y})   # loads the kernels before the capture
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        fn(**dev, outputs={"y": y})
        graph = stream.end_capture()
        y.fill(nan_bits(d))
        for _ in range(200):
            graph.launch(stream)
        stream.synchronize()
    err = rel(download(y, d), ref)
    record("linear v2", "chain of two kernels under PDL, 200 replays", f"{err:.1e}")
    assert err <= 1e-2
