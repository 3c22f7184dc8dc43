"""grid_reduce on the GPU: deterministic (bit-exact vs the simulator's CTA-order sum when the
partials are exact), and the arrival counters reset so that repeated launches (CUDA-graph
replays) give the same bits."""
from __future__ import annotations

import numpy as np
import pytest

from fusionc.sim import simulate_kernel
from tests.codegen.programs import grid_sum, oproj_kernel
from tests.gpu.common import kernel, record, rel

# (4, 50): 200 CTAs, resident only at two CTAs per SM (the load-time occupancy query checks it)
SUMS = [(1, 5, 100), (4, 3, 257), (16, 2, 64), (4, 50, 300)]


def precompile():
    for c, g, n in SUMS:
        kernel(grid_sum(c, g, n))
    kernel(oproj_kernel(4, 8, 64, 128))


@pytest.mark.gpu
@pytest.mark.parametrize("size,grid,n", SUMS)
def test_grid_sum_bit_exact_and_replayable(size, grid, n):
    from fusionc.runtime.run import run_kernel
    k = kernel(grid_sum(size, grid, n))
    x = (np.random.default_rng(n).standard_normal((grid * size, n)) * 1e3).astype(np.float32)
    args = {"x": x, "y": np.full((1, n), np.nan, np.float32)}
    want = simulate_kernel(k, args)["y"]
    runs = [run_kernel(k, args)["y"] for _ in range(3)]
    from fusionc.codegen.generate import generate_cuda
    resident = generate_cuda(k).resident
    assert resident  # every case here is resident (the (4, 50) one only at two CTAs per SM)
    how = "parallel" if resident else "last CTA"
    record("grid_reduce", f"sum of {grid * size} CTAs ({how}), n={n}",
           "bit-exact, 3 launches identical")
    for got in runs:
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.gpu
def test_output_projection_over_heads():
    from fusionc.runtime.run import run_kernel
    k = kernel(oproj_kernel(4, 8, 64, 128))
    rng = np.random.default_rng(3)
    args = {"x": rng.standard_normal((3, 512)), "w": rng.standard_normal((128, 512)) / 16,
            "y": np.full((3, 128), np.nan)}
    want = simulate_kernel(k, args)["y"]
    got = run_kernel(k, args, repeat=5)["y"]
    again = run_kernel(k, args)["y"]
    record("grid_reduce", "o-proj 8 heads x C=4, f16", f"vs sim {rel(got, want):.1e}, "
           f"deterministic: {np.array_equal(got, again)}")
    assert rel(got, want) <= 1e-2 and np.array_equal(got, again)
