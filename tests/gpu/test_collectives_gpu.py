"""ClusterReduce (sum, max) and ClusterGather on the GPU against the simulator, bit for bit, for
every cluster size 1..16 and several payloads; then 1000 launches of a debug build in which one
CTA (a different rank each launch) spins before its shared-memory store and before the
collective, so a missing barrier shows up as a wrong or NaN result."""
from __future__ import annotations

import numpy as np
import pytest

from fusionc.interp.numerics import round_to
from fusionc.ir import DType
from fusionc.sim import simulate_kernel
from tests.gpu.common import bits, kernel, record
from tests.sim.programs import collective_kernel

SIZES = [1, 2, 4, 8, 16]
PAYLOADS = [((7,), "f32"), ((4, 33), "f32"), ((2, 64), "f16"), ((3, 40), "bf16"),
            ((1024,), "f32")]
KINDS = ["sum", "max", "gather"]
GRID, REPS, DELAY_NS = 3, 1000, 3000


def case(kind, size, shape, dtype):
    axis = len(shape) - 1
    text = collective_kernel(kind, size, GRID, shape, dtype, axis=axis)
    return kernel(text), kernel(text, delay=True), axis


def stress(kd, xs, wants, dt, size, reps=REPS) -> int:
    """Launch the debug build ``reps`` times (CTA of rank i % size delayed, input i % 2) and
    return how many launches did not give the expected bits."""
    import cupy
    from fusionc.codegen import CodegenOptions, compile_kernel
    from fusionc.runtime.run import load
    from fusionc.runtime.transfer import upload
    lk = load(compile_kernel(kd, CodegenOptions(delay=True)))
    xd = [upload(x, dt) for x in xs]
    want = cupy.stack([cupy.asarray(bits(w, dt)).ravel() for w in wants])
    n = want.shape[1]
    pad = -(-n * want.itemsize // 16) * 16 // want.itemsize  # 16-byte aligned output slots
    ys = cupy.empty((reps, pad), want.dtype)
    ys.fill(0x7FC0 if want.itemsize == 2 else 0x7FC00000)  # NaN bits
    shape = wants[0].shape
    for i in range(reps):
        y = ys[i, :n].view(xd[0].dtype).reshape(shape)
        lk.launch({"x": xd[i % 2], "y": y}, {}, delay=(i % size, DELAY_NS))
    cupy.cuda.get_current_stream().synchronize()
    expect = want[cupy.arange(reps) % 2]
    return int((ys[:, :n] != expect).any(axis=1).sum())


def precompile():
    for kind in KINDS:
        for size in SIZES:
            for shape, dtype in PAYLOADS:
                case(kind, size, shape, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dtype", PAYLOADS, ids=lambda p: str(p))
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_collective_matches_simulator_bit_for_bit(kind, size, shape, dtype):
    from fusionc.runtime.run import run_kernel
    k, kd, axis = case(kind, size, shape, dtype)
    dt = DType(dtype)
    rng = np.random.default_rng(size * 7 + len(shape))
    x = round_to(rng.standard_normal((GRID * size, *shape)) * 3, dt)
    yshape = list(x.shape)
    if kind == "gather":
        yshape[axis + 1] *= size
    args = {"x": x, "y": np.full(yshape, np.nan)}
    want = simulate_kernel(k, args)["y"]
    got = run_kernel(k, args)["y"]
    assert np.array_equal(bits(got, dt), bits(want, dt))
    # the delayed-CTA stress run: inputs alternate between x and x2, so stale shared memory
    # from the previous launch never looks right; every output is checked on the device
    x2 = round_to(rng.standard_normal(x.shape) * 3, dt)
    want2 = simulate_kernel(k, {"x": x2, "y": args["y"]})["y"]
    bad = stress(kd, [x, x2], [want, want2], dt, size)
    record("collective", f"{kind} C={size} {dtype}{list(shape)}",
           f"bit-exact; {REPS - bad}/{REPS} delayed-CTA launches exact")
    assert bad == 0
