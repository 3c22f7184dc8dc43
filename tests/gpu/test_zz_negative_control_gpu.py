"""Negative control of the delayed-CTA stress test (runs last: it breaks the execution model).

The same ClusterReduce program without the cluster barrier between the shared-memory store and
the collective must be caught: peers read the delayed CTA's buffer before it is written."""
from __future__ import annotations

import numpy as np
import pytest

from fusionc.interp.numerics import round_to
from fusionc.ir import DType
from fusionc.sim import simulate_kernel
from tests.gpu.common import kernel, record
from tests.gpu.test_collectives_gpu import GRID, stress
from tests.sim.programs import collective_kernel

SIZE, SHAPE, REPS = 4, (1024,), 200


def case():
    good = collective_kernel("sum", SIZE, GRID, SHAPE, "f32")
    bad = good.replace("  smem_store(%buf, %p)\n  cluster_barrier()\n", "  smem_store(%buf, %p)\n")
    assert bad != good
    return kernel(good), kernel(bad, verify=False, delay=True)


def precompile():
    case()


@pytest.mark.gpu
def test_missing_barrier_is_caught_by_the_delayed_cta():
    good, bad = case()
    rng = np.random.default_rng(0)
    xs = [round_to(rng.standard_normal((GRID * SIZE, *SHAPE)), DType.f32) for _ in range(2)]
    y = np.full(xs[0].shape, np.nan)
    wants = [simulate_kernel(good, {"x": x, "y": y})["y"] for x in xs]
    n_bad = stress(bad, xs, wants, DType.f32, SIZE, reps=REPS)
    record("negative control", f"sum C={SIZE} f32{list(SHAPE)} without the first barrier",
           f"{n_bad}/{REPS} delayed-CTA launches wrong (must be > 0)")
    assert n_bad > 0
