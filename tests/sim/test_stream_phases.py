"""A streamed kernel of two phases (``units`` regions) chained by per-chunk counters
(``group_flush {signal}`` → ``counter_wait {slot = step, reset = exit}``): the result does not
depend on the grid or the interleaving, and leaving out the signal, the fence or a wait is
reported by name."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fusionc.errors import SimulationError, VerifyError
from fusionc.ir import parse_module
from fusionc.sim.simulator import simulate_kernel
from fusionc.stream.schedule import wait_target

# y = (x · W1ᵀ) · W2ᵀ with h = x · W1ᵀ [B, 200] in phase 0 (4 groups of 64 columns: 2 per
# K chunk of phase 1, whose 2 chunks wait for 2 and 2 groups)
TWO = """
kernel @two {{grid = 132, cluster = 1, threads = 288, max_batch = 4}} (%x: f16[B, 256], %w1: f16[200, 256], %w2: f16[96, 200], %h: f16[B, 200], %y: f16[B, 96]) {{
  %acc = acc_alloc() : f32[B, 64]
  %ring = ring_alloc() {{rows = 64}} : f16[3, 72, 128]
  units() {{count = 8, group = 2}} ({{
    ring_claim(%ring)
    ring_issue(%ring, %w1, %x)
    %tw, %tx = ring_stage(%ring) {{rows = 64}} : f16[64, 128], f16[8, 128]
    ring_wait(%ring)
    acc_gemv(%acc, %tx, %tw) {{rows = 64, cols = 128, n = 200, k = 256}}
    ring_release(%ring)
    group_flush(%acc, %h) {{rows = 64{signal}}}
  }})
  units() {{count = 4, group = 2}} ({{
    {wait}
    {fence}
    ring_claim(%ring)
    ring_issue(%ring, %w2, %h)
    %tw2, %tx2 = ring_stage(%ring) {{rows = 64}} : f16[64, 128], f16[8, 128]
    ring_wait(%ring)
    acc_gemv(%acc, %tx2, %tw2) {{rows = 64, cols = 128, n = 96, k = 200}}
    ring_release(%ring)
    group_flush(%acc, %y) {{rows = 64}}
  }})
  return %h, %y
}}
"""
SIGNAL = ', signal = "h", per = 2'
WAIT = ('counter_wait() {name = "h", slot = step, target = 2, total = 4, reset = exit, '
        'warp = producer}')
FENCE = "fence_proxy_async() {warp = producer}"


def _kernel(signal=SIGNAL, wait=WAIT, fence=FENCE):
    return parse_module(TWO.format(signal=signal, wait=wait, fence=fence)).graphs[0]


def _inputs(rng, batch):
    x = rng.standard_normal((batch, 256))
    w1 = rng.standard_normal((200, 256)) / 16
    w2 = rng.standard_normal((96, 200)) / 14
    f = lambda a: a.astype(np.float16).astype(np.float64)   # noqa: E731
    h = f(f(x) @ f(w1).T)
    return {"x": x, "w1": w1, "w2": w2, "h": np.full((batch, 200), np.nan),
            "y": np.full((batch, 96), np.nan)}, f(h) @ f(w2).T


@settings(max_examples=25, deadline=None)
@given(grid=st.integers(1, 8), seed=st.integers(0, 10**6), lazy=st.booleans(),
       batch=st.integers(1, 4))
def test_two_phases_are_independent_of_grid_and_interleaving(grid, seed, lazy, batch):
    args, ref = _inputs(np.random.default_rng(seed), batch)
    out = simulate_kernel(_kernel(), args, grid=grid, seed=seed, lazy_copies=lazy)["y"]
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3


def _fails(kernel, match, grid=4):
    args, _ = _inputs(np.random.default_rng(0), 2)
    with pytest.raises(SimulationError, match=match):
        for seed in range(20):   # some interleaving reads h before it is complete
            simulate_kernel(kernel, args, grid=grid, seed=seed)


@pytest.mark.parametrize("grid", [1, 4])
def test_a_phase_without_the_wait_reads_unpublished_rows(grid):
    """On one CTA too: its producer is ordered with its own consumers only by the ring. The
    verifier refuses the kernel as well."""
    k = parse_module(TWO.format(signal=SIGNAL, wait="", fence=""), verify=False).graphs[0]
    _fails(k, "before a flush of this launch wrote it|without acquiring it", grid=grid)
    with pytest.raises(VerifyError, match="phase 1 reads %h, which phase 0's flushes write"):
        _kernel(wait="", fence="")


@pytest.mark.parametrize("wait, fence", [(WAIT, ""), (FENCE + "\n    " + WAIT, "")])
def test_the_wait_without_the_proxy_fence_after_it(wait, fence):
    """Reported by the simulator and refused by the code generator."""
    from fusionc.codegen.streamed import plan
    from fusionc.errors import CompileError
    _fails(_kernel(wait=wait, fence=fence), "TMA read of data written with ordinary stores")
    with pytest.raises(CompileError, match="no fence_proxy_async before ring_issue"):
        plan(_kernel(wait=wait, fence=fence))


def test_a_wait_on_chunks_no_flush_signals():
    k = parse_module(TWO.format(signal="", wait=WAIT, fence=FENCE), verify=False).graphs[0]
    _fails(k, "a counter nothing signals")
    with pytest.raises(VerifyError, match="which nothing in the kernel signals"):
        _kernel(signal="")


def test_wait_target_gives_the_last_chunk_the_rest():
    assert [wait_target(4, 7, s) for s in range(2)] == [4, 3]
    assert [wait_target(2, 0, s) for s in range(3)] == [2, 2, 2]


def test_a_shared_wait_must_reset_at_exit():
    k = TWO.format(signal=SIGNAL, wait=WAIT.replace(", reset = exit", ""), fence=FENCE)
    with pytest.raises(VerifyError, match="reset = exit"):
        parse_module(k).graphs[0]


@pytest.mark.parametrize("wait", [WAIT.replace("target = 2", "target = 4"),
                                  WAIT.replace("total = 4", "total = 3")])
def test_a_wait_that_disagrees_with_its_signals_is_refused(wait):
    with pytest.raises(VerifyError, match="signalled by phase 0"):
        parse_module(TWO.format(signal=SIGNAL, wait=wait, fence=FENCE)).graphs[0]


@pytest.mark.parametrize("change, match", [
    (dict(wait=WAIT.replace(", warp = producer", "")), "warp = consumer"),
    (dict(wait=WAIT + "\n    " + FENCE + "\n    " + WAIT), "one of 2 such waits"),
    (dict(wait=WAIT.replace("slot = step", "slot = group")), "slot = group"),
])
def test_chunk_waits_that_would_not_guard_the_copies_are_refused(change, match):
    with pytest.raises(VerifyError, match=match):
        _kernel(**change)


def test_chunks_that_do_not_match_the_next_phase_are_refused():
    # 3 groups of 64 columns per counter: 192-column chunks for a phase of 128-column K chunks
    text = TWO.format(signal=SIGNAL.replace("per = 2", "per = 3"),
                      wait=WAIT.replace("target = 2", "target = 3"), fence=FENCE)
    with pytest.raises(VerifyError, match="chunks of 3 x 64 columns"):
        parse_module(text)


@pytest.mark.parametrize("old, new, match", [
    ("  units() {{count = 4", "  %acc9 = acc_alloc() : f32[B, 64]\n  units() {{count = 4",
     "an op between two units regions"),
    ("  units() {{count = 8", "  %ring2 = ring_alloc() {{rows = 64}} : f16[3, 72, 128]\n"
     "  units() {{count = 8", "a second ring_alloc"),
])
def test_kernel_layouts_the_phases_do_not_take(old, new, match):
    with pytest.raises(VerifyError, match=match):
        parse_module(TWO.replace(old, new, 1).format(signal=SIGNAL, wait=WAIT, fence=FENCE))


def test_a_wait_after_the_copies_it_guards_is_refused():
    k = TWO.format(signal=SIGNAL, wait="", fence="").replace(
        "ring_issue(%ring, %w2, %h)", "ring_issue(%ring, %w2, %h)\n    " + WAIT + "\n    " + FENCE)
    with pytest.raises(VerifyError, match="with no counter_wait on 'h' before it"):
        parse_module(k)


@pytest.mark.parametrize("old, new, match", [
    ("acc_gemv(%acc, %tx2, %tw2)", "acc_gemv(%acc2, %tx2, %tw2)", "the same accumulator"),
])
def test_a_flush_of_another_accumulator_is_refused(old, new, match):
    k = TWO.replace("  %ring = ring_alloc()", "  %acc2 = acc_alloc() : f32[B, 64]\n"
                    "  %ring = ring_alloc()").replace(old, new)
    with pytest.raises(VerifyError, match=match):
        parse_module(k.format(signal=SIGNAL, wait=WAIT, fence=FENCE))


def test_a_flush_before_its_gemv_is_refused():
    k = TWO.replace("    group_flush(%acc, %h) {{rows = 64{signal}}}\n", "").replace(
        "    ring_claim(%ring)\n    ring_issue(%ring, %w1, %x)",
        "    group_flush(%acc, %h) {{rows = 64{signal}}}\n    ring_claim(%ring)\n"
        "    ring_issue(%ring, %w1, %x)")
    with pytest.raises(VerifyError, match="group_flush before the region's acc_gemv"):
        parse_module(k.format(signal=SIGNAL, wait=WAIT, fence=FENCE))
