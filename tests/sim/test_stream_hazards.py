"""The streamed-kernel simulator (fusionc.sim.grid): a correct ring program gives the same result
on every virtual grid and interleaving; each hazard of design v2 §6 is reported by name."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fusionc.errors import SimulationError
from fusionc.ir import parse_module
from fusionc.sim.simulator import simulate_kernel

LINEAR = """
kernel @lin {{grid = 132, cluster = 1, threads = 288, max_batch = 4}} (%x: f16[B, 256], %w: f16[200, 256], %y: f16[B, 200]) {{
  %acc = acc_alloc() : f32[B, 64]
  %ring = ring_alloc() {{rows = 64}} : f16[4, 68, 128]
  units() {{count = 8, group = 2}} ({{
    {claim}
    ring_issue(%ring, %w, %x)
    {wait}
    %tw, %tx = ring_stage(%ring) {{rows = 64}} : f16[64, 128], f16[4, 128]
    acc_gemv(%acc, %tx, %tw) {{rows = 64, cols = 128, n = 200, k = 256}}
    ring_release(%ring)
    group_flush(%acc, %y) {{rows = 64}}
  }})
  return %y
}}
"""
CLAIM, WAIT = "ring_claim(%ring)", "ring_wait(%ring)"


def _kernel(claim=CLAIM, wait=WAIT):
    return parse_module(LINEAR.format(claim=claim, wait=wait)).graphs[0]


def _inputs(rng, batch=3):
    x = rng.standard_normal((batch, 256)).astype(np.float32)
    w = (rng.standard_normal((200, 256)) / 16).astype(np.float32)
    ref = x.astype(np.float16).astype(np.float64) @ w.astype(np.float16).astype(np.float64).T
    return {"x": x, "w": w, "y": np.full((batch, 200), np.nan)}, ref


@settings(max_examples=25, deadline=None)
@given(grid=st.integers(1, 8), seed=st.integers(0, 10**6), lazy=st.booleans(),
       batch=st.integers(1, 4))
def test_ring_program_is_independent_of_grid_and_interleaving(grid, seed, lazy, batch):
    args, ref = _inputs(np.random.default_rng(seed), batch)
    out = simulate_kernel(_kernel(), args, grid=grid, seed=seed, lazy_copies=lazy)["y"]
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3


def _hazard(kernel, name, **kw):
    args, _ = _inputs(np.random.default_rng(0))
    with pytest.raises(SimulationError) as e:
        simulate_kernel(kernel, args, **kw)
    assert e.value.message.startswith(name), e.value.message
    return e.value


def test_read_before_copy_completed():
    _hazard(_kernel(wait=""), "stage read before its copy completed", grid=1, lazy_copies=True)


def test_overwritten_before_release():
    _hazard(_kernel(claim=""), "stage overwritten before release", grid=1, lazy_copies=True)


@pytest.mark.parametrize("which", ["claim", "wait"])
def test_stale_parity(which):
    k = _kernel(**{which: f"ring_{which}(%ring) {{parity_offset = 1}}"})
    _hazard(k, "stale mbarrier parity", grid=1)


PROXY = """
kernel @k {{grid = 2, cluster = 1, threads = 288, max_batch = 1}} (%x: f16[1, 128], %w: f16[128, 128], %z: f16[128, 128], %y: f16[1, 128]) {{
  %v = load(%w) {{offsets = ["64*cluster", "0"], sizes = [64, 128]}} : f16[64, 128]
  store(%z, %v) {{offsets = ["64*cluster", "0"]}}
  counter_signal() {{name = "z", index = 0}}
  counter_signal() {{name = "z", index = 1}}
  %acc = acc_alloc() : f32[1, 64]
  %ring = ring_alloc() {{rows = 64}} : f16[2, 65, 128]
  units() {{count = 2, group = 1}} ({{
    counter_wait() {{name = "z", slot = unit, target = 2, warp = producer}}
    {fence}
    ring_claim(%ring)
    ring_issue(%ring, %z, %x)
    ring_wait(%ring)
    %tw, %tx = ring_stage(%ring) {{rows = 64}} : f16[64, 128], f16[1, 128]
    acc_gemv(%acc, %tx, %tw) {{rows = 64, cols = 128, n = 128, k = 128}}
    ring_release(%ring)
  }})
  return %z, %y
}}
"""


def _proxy(fence):
    k = parse_module(PROXY.format(fence=fence)).graphs[0]
    rng = np.random.default_rng(1)
    return k, {"x": rng.standard_normal((1, 128)), "w": rng.standard_normal((128, 128)),
               "z": np.zeros((128, 128)), "y": np.zeros((1, 128))}


def test_tma_read_of_generic_writes_needs_the_proxy_fence():
    k, args = _proxy("fence_proxy_async() {warp = producer}")
    out = simulate_kernel(k, args, seed=3)
    np.testing.assert_array_equal(out["z"], args["w"].astype(np.float16))
    k, args = _proxy("")
    with pytest.raises(SimulationError, match="TMA read of data written with ordinary stores"):
        simulate_kernel(k, args, seed=3)


CYCLE = """
kernel @k {{grid = 2, cluster = 1, threads = 128, max_batch = 1}} (%y: f16[1, 64]) {{
  units() {{count = 2, group = 1}} ({{
    counter_wait() {{name = "{wait}", slot = unit}}
    counter_signal() {{name = "a", slot = unit}}
  }})
  return %y
}}
"""


def test_counter_nothing_signals():
    """Reported by the simulator (on a kernel the verifier did not see) and by the verifier."""
    from fusionc.errors import VerifyError
    k = parse_module(CYCLE.format(wait="b"), verify=False).graphs[0]
    with pytest.raises(SimulationError, match=": a counter nothing signals"):
        simulate_kernel(k, {"y": np.zeros((1, 64))}, grid=2)
    with pytest.raises(VerifyError, match="which nothing in the kernel signals"):
        parse_module(CYCLE.format(wait="b"))


def test_wait_cycle():
    k = parse_module(CYCLE.format(wait="a")).graphs[0]
    with pytest.raises(SimulationError, match=": a wait cycle"):
        simulate_kernel(k, {"y": np.zeros((1, 64))}, grid=2)
