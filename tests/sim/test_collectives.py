"""ClusterReduce / ClusterGather in the simulator against numpy, for every cluster size."""
from __future__ import annotations

import numpy as np
import pytest

from fusionc.interp.numerics import round_to
from fusionc.ir import DType, parse_module, print_module
from fusionc.sim import simulate_kernel
from tests.sim.programs import collective_kernel

SIZES = [1, 2, 4, 8, 16]
SHAPES = [(1,), (7,), (4, 33), (2, 3, 8)]


def tree_sum(parts: list[np.ndarray]) -> np.ndarray:
    """Pairwise tree over ranks in fp32: (x0 + x1) + (x2 + x3), ... (the documented order)."""
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] for i in range(0, len(parts), 2)]
    return parts[0]


def run(text: str, x: np.ndarray, y_shape, y_dtype: DType):
    m = parse_module(text)
    assert parse_module(print_module(m)) == m
    y = np.full(y_shape, np.nan, y_dtype.numpy)
    return simulate_kernel(m.graphs[0], {"x": x, "y": y})["y"]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_cluster_reduce_sum_and_max(size, shape, dtype):
    grid = 2
    rng = np.random.default_rng(size * 100 + len(shape))
    dt = DType(dtype)
    x = round_to(rng.standard_normal((grid * size, *shape)) * 3, dt)
    for kind in ("sum", "max"):
        out = run(collective_kernel(kind, size, grid, shape, dtype), x, x.shape, dt)
        for c in range(grid):
            parts = [x[c * size + r].astype(np.float32) for r in range(size)]
            want = tree_sum(parts) if kind == "sum" else np.max(parts, axis=0)
            want = round_to(want, dt)
            for r in range(size):  # every CTA holds the identical result
                np.testing.assert_array_equal(out[c * size + r], want)


@pytest.mark.parametrize("size", SIZES)
def test_cluster_reduce_schedules_agree(size):
    """Any order of the butterfly masks gives every CTA the full sum (same up to rounding)."""
    rng = np.random.default_rng(size)
    x = rng.standard_normal((size, 5)).astype(np.float32)
    masks = tuple(reversed([1 << i for i in range(size.bit_length() - 1)]))
    out = run(collective_kernel("sum", size, 1, (5,), "f32", masks=masks), x, x.shape, DType.f32)
    np.testing.assert_allclose(out, np.broadcast_to(x.sum(0), x.shape), rtol=1e-5, atol=1e-5)
    assert np.all(out == out[0])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("shape,axis", [((3,), 0), ((2, 5), 0), ((2, 5), 1), ((2, 3, 4), 2)])
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_cluster_gather(size, shape, axis, dtype):
    grid = 3
    dt = DType(dtype)
    rng = np.random.default_rng(size + axis)
    x = round_to(rng.standard_normal((grid * size, *shape)), dt)
    oshape = list(shape)
    oshape[axis] *= size
    out = run(collective_kernel("gather", size, grid, shape, dtype, axis=axis), x,
              (grid * size, *oshape), dt)
    for c in range(grid):
        want = np.concatenate([x[c * size + r] for r in range(size)], axis=axis)
        for r in range(size):
            np.testing.assert_array_equal(out[c * size + r], want)


def test_reduce_accumulates_in_fp32_then_rounds():
    """f16 payloads are summed in fp32 and rounded once: 60000 + 60000 overflows f16 to inf
    (as on the GPU), while 60000 + 60000 - 60000 - 60000 over 4 CTAs is exactly 0."""
    x = np.array([[60000.0], [60000.0]], np.float16)
    out = run(collective_kernel("sum", 2, 1, (1,), "f16"), x, (2, 1), DType.f16)
    assert np.all(np.isinf(out))
    x = np.array([[60000.0], [60000.0], [-60000.0], [-60000.0]], np.float16)
    out = run(collective_kernel("sum", 4, 1, (1,), "f16"), x, (4, 1), DType.f16)
    assert np.all(out == 0)
