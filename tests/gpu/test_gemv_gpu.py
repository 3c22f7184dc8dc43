"""GEMV on the GPU: split-K (cluster_reduce) and split-N (cluster_gather) against the simulator
and a float64 reference, and masked GEMV with K and N tails whose weights lie at the start of a
NaN-filled allocation (an over-read past K or N gives NaN)."""
from __future__ import annotations

import numpy as np
import pytest

from fusionc.interp.numerics import round_to
from fusionc.ir import DType
from fusionc.sim import simulate_kernel
from tests.codegen.programs import masked_gemv
from tests.gpu.common import kernel, record, rel
from tests.sim.programs import splitk_gemv

SCHEMES = [(s, c, d) for s in ("splitk", "gather") for c in (1, 4, 16)
           for d in ("f32", "f16", "bf16")]
TAILS = [0, 8, 32, 3, "small"]  # K = 4 tiles of 64 minus r; "small": K = 40, ranks 1..3 idle
TAIL_DTYPES = ["f16", "f32"]


def splitk_case(scheme, size, dtype):
    return kernel(splitk_gemv(size, 3, 64, 32, dtype, scheme=scheme))


def tail_case(r, dtype):
    if r == "small":  # K smaller than one pipeline step; CTAs of rank > 0 see only padding
        return kernel(masked_gemv(4, 3, 40, 16, 40, 44, dtype)), 40
    return kernel(masked_gemv(4, 3, 64, 16, 4 * 64 - r, 44, dtype)), 4 * 64 - r


MMA_SHAPES = [  # (scheme, size, grid, k_tile, n_tile): warps split K and add atomically; many
    ("splitk", 4, 3, 64, 32),  # strips per warp; a strip of 10 rows (rows past the tile idle)
    ("splitk", 2, 2, 256, 256), ("gather", 4, 2, 64, 40)]
MMA = [(sh, b, d, p) for sh in MMA_SHAPES for b in (3, 16, 24) for d in ("f16", "bf16")
       for p in (0, 2)]


def mma_case(shape, batch, dtype, pipe):
    """A static batch (24: two passes of 16 rows over the weights), tensor cores forced,
    software pipelining off or forced."""
    scheme, size, grid, k_tile, n_tile = shape
    return kernel(splitk_gemv(size, grid, k_tile, n_tile, dtype, batch=str(batch),
                              scheme=scheme), gemv_mma_batch=1, gemv_mma_pipeline=pipe)


BANDWIDTH = [(b, t, u) for b in (1, 8) for t, u in ((128, 4), (256, 4), (256, 8), (512, 4))]


def bandwidth_case(batch_bucket, threads=128, unroll=4):
    """W: [8192, 4096] f16 (64 MB), split-K over clusters of 4, 64 rows per cluster."""
    text = splitk_gemv(4, 128, 1024, 64, "f16").replace(
        "max_batch = 8", f"max_batch = {batch_bucket}, threads = {threads}")
    return kernel(text, gemv_unroll=unroll)


def precompile():
    for case in BANDWIDTH:
        bandwidth_case(*case)
    for s in SCHEMES:
        splitk_case(*s)
    for r in TAILS:
        for d in TAIL_DTYPES:
            tail_case(r, d)
    for m in MMA:
        mma_case(*m)


def _check(k, x, w, dt, label):
    from fusionc.runtime.run import run_kernel
    args = {"x": x, "w": w, "y": np.full((x.shape[0], w.shape[0]), np.nan)}
    want = simulate_kernel(k, args)["y"]
    got = run_kernel(k, args)["y"]
    ref = round_to(x, dt).astype(np.float64) @ round_to(w, dt).astype(np.float64).T
    e_sim, e_ref = rel(got, want), rel(got, ref)
    record("gemv", label, f"vs sim {e_sim:.1e}, vs float64 {e_ref:.1e}")
    assert np.all(np.isfinite(got))
    assert e_sim <= (1e-5 if dt == DType.f32 else 1e-2)
    assert e_ref <= (1e-5 if dt == DType.f32 else 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 5, 8])
@pytest.mark.parametrize("scheme,size,dtype", SCHEMES)
def test_gemv_matches_simulator(scheme, size, dtype, batch):
    k = splitk_case(scheme, size, dtype)
    rng = np.random.default_rng(size + batch)
    x = rng.standard_normal((batch, size * 64))
    w = rng.standard_normal((3 * 32, size * 64)) / 8
    _check(k, x, w, DType(dtype), f"{scheme} C={size} {dtype} B={batch}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape,batch,dtype,pipe", MMA)
def test_gemv_on_tensor_cores(shape, batch, dtype, pipe):
    from fusionc.codegen import CodegenOptions, compile_kernel
    from fusionc.runtime.run import run_kernel
    k = mma_case(shape, batch, dtype, pipe)
    opts = CodegenOptions(gemv_mma_batch=1, gemv_mma_pipeline=pipe)
    assert "fc_gemv_mma<" in compile_kernel(k, opts).source.source
    rng = np.random.default_rng(batch)
    _, size, grid, k_tile, n_tile = shape
    x = rng.standard_normal((batch, size * k_tile))
    w = rng.standard_normal((grid * n_tile, size * k_tile)) / 8
    args = {"x": x, "w": w, "y": np.full((batch, w.shape[0]), np.nan)}
    want = simulate_kernel(k, args)["y"]
    got = run_kernel(k, args, options=opts)["y"]
    dt = DType(dtype)
    ref = round_to(x, dt).astype(np.float64) @ round_to(w, dt).astype(np.float64).T
    record("gemv mma", f"{shape} B={batch} {dtype} pipeline {pipe}",
           f"vs sim {rel(got, want):.1e}, vs float64 {rel(got, ref):.1e}")
    assert np.all(np.isfinite(got))
    assert rel(got, want) <= 1e-2 and rel(got, ref) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TAIL_DTYPES)
@pytest.mark.parametrize("r", TAILS)
def test_masked_gemv_tails_never_read_past_the_weights(r, dtype):
    import cupy
    from fusionc.runtime.run import load
    from fusionc.codegen import compile_kernel
    from fusionc.runtime.transfer import download, host_to_device_bits
    k, kk = tail_case(r, dtype)
    dt = DType(dtype)
    rng = np.random.default_rng(kk)
    x, w = rng.standard_normal((5, kk)), rng.standard_normal((44, kk)) / 8
    want = simulate_kernel(k, {"x": x, "w": w, "y": np.full((5, 44), np.nan)})["y"]
    lk = load(compile_kernel(k))
    dev = {}
    for name, a in (("x", x), ("w", w)):  # at the start of a NaN-filled allocation
        b = host_to_device_bits(a, dt)
        big = cupy.full(b.size + 4096, cupy.nan, b.dtype)
        big[:b.size] = cupy.asarray(b.ravel())
        dev[name] = big[:b.size].reshape(b.shape)
    dev["y"] = cupy.full((5, 44), cupy.nan, dev["x"].dtype)
    lk.launch(dev, {"B": 5})
    got = download(dev["y"], dt)
    ref = round_to(x, dt).astype(np.float64) @ round_to(w, dt).astype(np.float64).T
    record("gemv tail", f"K={kk} over 4 CTAs, N=44 {dtype}",
           f"vs sim {rel(got, want):.1e}, vs float64 {rel(got, ref):.1e}")
    assert np.all(np.isfinite(got))
    assert rel(got, want) <= (1e-5 if dt == DType.f32 else 1e-2)
    assert rel(got, ref) <= (1e-5 if dt == DType.f32 else 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,threads,unroll", BANDWIDTH)
def test_gemv_bandwidth(batch, threads, unroll):
    """Not a pass/fail test: the weight-streaming rate of a plain split-K GEMV kernel."""
    import cupy
    from fusionc.codegen import CodegenOptions, compile_kernel
    from fusionc.runtime.run import load
    from fusionc.runtime.transfer import upload
    k = bandwidth_case(batch, threads, unroll)
    lk = load(compile_kernel(k, CodegenOptions(gemv_unroll=unroll)))
    rng = np.random.default_rng(0)
    ws = [upload(rng.standard_normal((8192, 4096), np.float32) / 64, DType.f16)
          for _ in range(3)]  # 192 MB: rotate past the 60 MB L2
    x = upload(rng.standard_normal((batch, 4096), np.float32), DType.f16)
    y = cupy.empty((batch, 8192), cupy.float16)
    for i in range(20):  # warm up
        lk.launch({"x": x, "w": ws[i % 3], "y": y}, {"B": batch})
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for i in range(100):
        start.record()
        lk.launch({"x": x, "w": ws[i % 3], "y": y}, {"B": batch})
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
    us = float(np.median(times))
    record("gemv bandwidth", f"8192x4096 f16 B={batch}, 128x4 CTAs of {threads}, {unroll} loads",
           f"{us:.1f} us median, {8192 * 4096 * 2 / us / 1e3:.0f} GB/s of weights")
