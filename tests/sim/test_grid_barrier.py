"""grid_barrier: after it every CTA reads what any CTA stored before it (a rotation through a
global buffer), in the simulator and in generated CUDA (NVRTC); reading another CTA's store
without it, a barrier inside a region, and a grid that cannot be resident at once are
rejected."""
from __future__ import annotations

import numpy as np
import pytest

from fusionc.errors import SimulationError, VerifyError
from fusionc.ir import parse_module
from fusionc.sim import simulate_kernel


def rotate(grid: int, size: int, barrier: str = "grid_barrier()", wrap: bool = False) -> str:
    """CTA u stores x[u] at t[u]; after the barrier it reads t[(u + 1) % n] into y[u]."""
    n = grid * size
    mid = f"when() {{on = cluster, lo = 0, hi = 1}} ({{\n    {barrier}\n  }})" if wrap \
        else barrier
    # the neighbour's row: u + 1, and for the last CTA row 0 through a second masked load
    return f"""
kernel @rot {{grid = {grid}, cluster = {size}, threads = 64}} (%x: f32[{n}, 4], %t: f32[{n}, 4], %y: f32[{n}, 4]) {{
  %a = load(%x) {{offsets = ["{size}*cluster + rank", "0"], sizes = [1, 4]}} : f32[1, 4]
  store(%t, %a) {{offsets = ["{size}*cluster + rank", "0"]}}
  {mid}
  %b = load(%t) {{offsets = ["{size}*cluster + rank + 1", "0"], sizes = [1, 4], masked = true}} : f32[1, 4]
  %c = load(%t) {{offsets = ["{size}*cluster + rank - {n - 1}", "0"], sizes = [1, 4], masked = true}} : f32[1, 4]
  %d = add(%b, %c) : f32[1, 4]
  store(%y, %d) {{offsets = ["{size}*cluster + rank", "0"]}}
  return %t, %y
}}
"""


@pytest.mark.parametrize("grid,size", [(1, 1), (3, 2), (5, 4), (2, 8)])
def test_grid_barrier_makes_every_store_visible(grid, size):
    k = parse_module(rotate(grid, size)).graphs[0]
    n = grid * size
    x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
    out = simulate_kernel(k, {"x": x, "t": np.full((n, 4), np.nan, np.float32),
                              "y": np.full((n, 4), np.nan, np.float32)})
    assert np.array_equal(out["y"], np.roll(x, -1, axis=0))


def test_reading_another_ctas_store_without_a_barrier_is_a_race():
    k = parse_module(rotate(2, 2, barrier="")).graphs[0]
    z = np.zeros((4, 4), np.float32)
    with pytest.raises(SimulationError, match="no ordering between CTAs of a grid"):
        simulate_kernel(k, {"x": z, "t": z.copy(), "y": z.copy()})


def test_grid_barrier_inside_a_region_is_rejected():
    with pytest.raises(VerifyError, match="grid_barrier inside a region"):
        parse_module(rotate(2, 2, wrap=True))


def test_grid_too_large_to_be_resident_is_rejected():
    with pytest.raises(VerifyError, match="at most 15 clusters of 8"):
        parse_module(rotate(16, 8))


@pytest.mark.parametrize("grid,size", [(3, 2), (2, 8)])
def test_grid_barrier_compiles(grid, size):
    from fusionc.codegen import compile_kernel
    ck = compile_kernel(parse_module(rotate(grid, size)).graphs[0])
    assert ck.cubin[:4] == b"\x7fELF" and ck.spills == 0
    src = ck.source.source
    assert "ld.acquire.gpu.global.u32" in src and "atomicAdd(arrive, 1u)" in src
    assert "fc_grid_sync_thread0(fc_counters + " in src and ck.source.resident
