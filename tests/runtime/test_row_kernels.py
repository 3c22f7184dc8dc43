"""The library path's row kernels (``fusionc.runtime.row_kernels``) compile with NVRTC for every
op and dtype without spills (no GPU needed: they run in tests/gpu/test_row_kernels_gpu.py), and a
planned library-path call launches them through the driver with raw pointers (no CuPy kernel)."""
import ctypes

import pytest

from fusionc.runtime import row_kernels
from fusionc.runtime.nvrtc import compile_cubin

DTYPES = ("f16", "bf16", "f32")


def test_every_kernel_compiles_without_spills():
    r = compile_cubin(row_kernels.source(), "row_kernels.cu")
    want = {f"fc_{op}_{dt}" for dt in DTYPES
            for op in ("add", "mul", "silu_mul", "silu", "rms_norm", "embedding")}
    want |= {f"fc_cast_{s}_{d}" for s in DTYPES for d in DTYPES}   # s == d: a copy
    assert want <= set(r.kernels), want - set(r.kernels)
    assert not any(r.spills.values()), r.spills


@pytest.fixture
def fake():
    pytest.importorskip("cuda.bindings")
    from benchmarks.cpu_fakes import fake_gpu
    with fake_gpu() as cu:
        yield cu


def test_a_launch_packs_pointers_and_row_strides_in_the_kernels_order(fake):
    launch = row_kernels.binary("add", "bf16", 6 * 100, 100, (200, 100, 100), 0)
    launch([0x1000, 0x2000, 0x3000], 7)
    cfg, _, params = fake.last
    argv = (ctypes.c_void_p * 8).from_address(params)
    got = [ctypes.c_longlong.from_address(argv[i]).value for i in range(8)]
    assert got == [0x1000, 200, 0x2000, 100, 0x3000, 100, 100, 600]
    assert (cfg.gridDimX, cfg.blockDimX) == (3, row_kernels.THREADS)


def test_an_empty_launch_is_skipped(fake):
    n = fake.launches
    row_kernels.rms_norm("f16", 0, 64, 1e-5, (64, 64, 64), 0)([1, 2, 3], 7)
    row_kernels.unary("silu", "f16", "f16", 0, 64, (64, 64), 0)([1, 2], 7)
    assert fake.launches == n


def test_a_planned_library_call_is_row_kernels_and_a_gemm(fake):
    """RMSNorm, SiLU and add each one driver launch, the GEMM through cuBLAS: nothing through
    CuPy (the plan enters no CuPy stream)."""
    import fusionc
    from benchmarks.cpu_fakes import fake_cupy_array
    from benchmarks.host_overhead_cpu import host_ops_graph
    from fusionc.runtime import plan
    cg = fusionc.compile(host_ops_graph(), max_batch=4, pipeline="fold-views,lower-library")
    assert [op.name for op in cg.host.body] == ["rms_norm", "library_call", "silu", "add"]
    assert not any(map(plan._on_cupy, cg.host.body))
    import numpy as np
    args = dict(x=fake_cupy_array((4, 1024), np.float16), norm=fake_cupy_array((1024,), np.float16),
                w=fake_cupy_array((1024, 1024), np.float16))
    cg(**args)
    n = fake.launches
    cg(**args)
    assert fake.launches - n == 3
    assert all(p.run is not None for p in cg._plans.values())


def test_a_cast_to_its_own_dtype_is_planned_as_a_copy(fake):
    """``cast`` to the dtype a value has survives lowering; the plan launches the copy kernel
    (there was none: the plan's construction failed after a good first call)."""
    import numpy as np

    import fusionc as fc
    from benchmarks.cpu_fakes import fake_cupy_array
    T = fc.dtype("f16")

    @fc.graph
    def same(x: T["B", 256]):
        return fc.cast(fc.silu(x), "f16")
    cg = fc.compile(same, max_batch=4, pipeline="fold-views,lower-library")
    assert [op.name for op in cg.host.body] == ["silu", "cast"]
    x = fake_cupy_array((3, 256), np.float16)
    cg(x)
    n = fake.launches
    cg(x)
    assert fake.launches - n == 2 and all(p.run is not None for p in cg._plans.values())
