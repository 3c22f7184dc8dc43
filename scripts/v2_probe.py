"""Probe one design-v2 linear on the GPU: time per call in a CUDA graph over rotated buffers,
and the fixed cost of a one-tile call; run under ncu for the kernel's own profile.

    python3 scripts/v2_probe.py 4096 4096 1 [f16]
    ncu --clock-control none -k regex:fusionc --launch-skip 2 --launch-count 1 \
        python3 scripts/v2_probe.py 4096 4096 1
"""
import sys

import cupy
import numpy as np

import fusionc as fc
from fusionc.ir import DType
from fusionc.runtime.transfer import upload


def module(n, k, dt):
    T = fc.dtype(dt)

    @fc.graph
    def lin(x: T["B", k], w: T[n, k]):
        return fc.linear(x, w, name="y")
    return lin


def time_call(n, k, b, dt, sets, reps=20, stages=8):
    pipe = (f"partition-units{{max_batch={b}}},stream-plan,insert-barriers,"
            f"smem-plan{{max_stages={stages}}}")
    fn = fc.compile(module(n, k, dt), max_batch=b, lowering="v2", pipeline=pipe)
    rng = np.random.default_rng(0)
    d = DType(dt)
    bufs = [dict(x=upload(rng.standard_normal((b, k)), d),
                 w=upload(rng.standard_normal((n, k)) / np.sqrt(k), d)) for _ in range(sets)]
    ys = [cupy.empty((b, n), bufs[0]["x"].dtype) for _ in range(sets)]
    for a, y in zip(bufs, ys):
        fn(**a, outputs={"y": y})
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        for a, y in zip(bufs, ys):
            fn(**a, outputs={"y": y})
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        times = []
        for _ in range(reps):
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            e0.record(s)
            g.launch(s)
            e1.record(s)
            e1.synchronize()
            times.append(cupy.cuda.get_elapsed_time(e0, e1) * 1e3 / sets)
    return float(np.median(times))


if __name__ == "__main__":
    n, k, b = (int(a) for a in sys.argv[1:4])
    dt = sys.argv[4] if len(sys.argv) > 4 else "f16"
    sets = max(2, -(-180 * 2**20 // (n * k * 2)) + 1)
    stages = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    us = time_call(n, k, b, dt, sets, stages=stages)
    print(f"{n}x{k} {dt} B={b} stages={stages}: {us:.1f} us per call ({sets} sets)")
