"""Bad streamed-kernel programs and options get named fusionc errors (op, IR line:column, what
is valid): never a numpy traceback or a silently wrong result."""
import numpy as np
import pytest

from fusionc.errors import FusionError, InputError, PassError, VerifyError
from fusionc.ir import parse_module
from fusionc.passes import run_pipeline
from fusionc.passes.stream import v2_pipeline
from fusionc.sim import simulate
from fusionc.sim.simulator import simulate_kernel
from tests.passes.graphs import linear_graph
from tests.sim.test_stream_hazards import CLAIM, LINEAR, WAIT, _inputs


@pytest.mark.parametrize("old, new, what", [
    ("{count = 8, group = 2}", "{count = 4, group = 2}", "count 4, group 2"),
    ("{count = 8, group = 2}", "{count = 8, group = 4}", "count 8, group 4"),
    ("n = 200", "n = 220", "n = 220"),
    ("ring_alloc() {rows = 64}", "ring_alloc() {rows = 32}", "rows = 64 of a ring"),
    ("f16[4, 68, 128]", "f16[4, 66, 128]", "activation rows per stage"),
])
def test_region_that_does_not_tile_its_weight(old, new, what):
    text = LINEAR.format(claim=CLAIM, wait=WAIT).replace(old, new)
    if "66" in new:
        text = text.replace("f16[4, 128]", "f16[2, 128]")
    with pytest.raises(FusionError, match=what):
        parse_module(text)


def test_per_unit_op_outside_the_region():
    text = LINEAR.format(claim=CLAIM, wait=WAIT).replace(
        "  return %y", "  ring_release(%ring)\n  return %y")
    with pytest.raises(VerifyError, match="outside the units region"):
        parse_module(text)


def test_batch_over_the_kernel_bucket():
    k = parse_module(LINEAR.format(claim=CLAIM, wait=WAIT)).graphs[0]
    args, _ = _inputs(np.random.default_rng(0), batch=5)   # max_batch = 4
    with pytest.raises(InputError, match="exceeds the kernel's max_batch"):
        simulate_kernel(k, args)
    low = run_pipeline(linear_graph(64, 128), v2_pipeline(2))
    with pytest.raises(InputError):
        simulate(low, {"x": np.ones((12, 128)), "w": np.ones((64, 128))})


@pytest.mark.parametrize("grid", [0, -1, 2.5])
def test_bad_virtual_grid(grid):
    k = parse_module(LINEAR.format(claim=CLAIM, wait=WAIT)).graphs[0]
    args, _ = _inputs(np.random.default_rng(0))
    with pytest.raises(InputError, match="grid"):
        simulate_kernel(k, args, grid=grid)


@pytest.mark.parametrize("pipeline, what", [
    ("partition-units{max_batch=2},partition-units", "already lowered"),
    ("partition-units{max_batch=2},stream-plan,insert-barriers,smem-plan{max_stages=1}",
     "max_stages"),
])
def test_misused_passes(pipeline, what):
    with pytest.raises(PassError, match=what):
        run_pipeline(linear_graph(64, 128), pipeline)


def test_a_counter_slot_with_several_waiters():
    from tests.sim.test_stream_hazards import CYCLE
    text = CYCLE.format(wait="a").replace('{name = "a", slot = unit}\n    counter_signal',
                                           '{name = "a"}\n    counter_signal', 1)
    with pytest.raises(VerifyError, match="one waiter"):
        parse_module(text)
