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


def test_a_split_is_planned_as_strided_pieces(fake, monkeypatch):
    """The MLP of a prompt chunk on the library path (RMSNorm, the fused gate/up GEMM, its split,
    SiLU·mul, the down GEMM, add): planned, the split's halves passed to SiLU·mul as the gate/up
    buffer's pointer and that plus I elements, rows 2·I apart, as the checked first call
    passes them; a GEMM reads a piece with its row stride (ldb of cuBLAS's x^T)."""
    import numpy as np

    import fusionc
    from benchmarks.cpu_fakes import fake_cupy_array
    from fusionc.models.blocks import mlp_block
    from fusionc.runtime import library
    calls = []
    launch = row_kernels.RowLaunch.__call__

    def record(self, ptrs, stream):
        strides = [s.value for s in self._scalars[:len(ptrs)]] if self.name.startswith(
            ("fc_silu_mul", "fc_add")) else []
        calls.append((self.name, tuple(ptrs), tuple(strides)))
        return launch(self, ptrs, stream)
    monkeypatch.setattr(row_kernels.RowLaunch, "__call__", record)
    monkeypatch.setattr(library._cublas(), "cublasGemmEx",
                        lambda *a: calls.append(("gemm", (a[7], a[10], a[14]), (a[12],))) or 0)
    cg = fusionc.compile(mlp_block(hidden=256, intermediate=512, eps=1e-5, dtype="f16"),
                         max_batch=4, pipeline="fold-views,lower-library")
    shapes = {"x": (3, 256), "mlp_norm": (256,), "w_gate_up": (1024, 256), "w_down": (256, 512)}
    args = {k: fake_cupy_array(s, np.float16) for k, s in shapes.items()}
    cg(**args)
    cg(**args)
    assert all(p.run is not None for p in cg._plans.values())
    first, second = calls[:5], calls[5:]
    assert [c[0] for c in second] == ["fc_rms_norm_f16", "gemm", "fc_silu_mul_f16", "gemm",
                                      "fc_add_f16"]
    gate_up = second[1][1][2]   # the first GEMM's output
    assert second[2][1][:2] == (gate_up, gate_up + 512 * 2) and second[2][2] == (1024, 1024, 512)
    assert first[:4] == second[:4]   # the general path's pointers and strides, the same
    assert second[1][2] == (256,) and second[3][2] == (512,)   # ldb: x's rows (contiguous)



def test_a_split_of_rows_is_sliced_along_its_axis():
    """``split`` along axis 0 on the library path: the general path's views cut rows (they cut
    the last axis whatever the axis was), and the plan leaves such pieces to it."""
    import numpy as np

    from fusionc.ir import parse_module
    from fusionc.runtime.host_ops import _views
    g = parse_module("""
graph @g(%x: f16[4, 6]) {
  %a, %b = split(%x) {axis = 0, sizes = [1, 3]} : f16[1, 6], f16[3, 6]
  return %a, %b
}""").graphs[0]
    x = np.arange(24).reshape(4, 6)
    a, b = _views(g.body[0], x, {})
    assert a.shape == (1, 6) and b.shape == (3, 6) and (b == x[1:]).all()


def _library(graph, **kw):
    import fusionc
    return fusionc.compile(graph, max_batch=4, pipeline="fold-views,lower-library", **kw)


def test_a_gemm_reads_a_piece_of_x_with_its_row_stride(fake, monkeypatch):
    """``linear`` of a split's second half: cuBLAS gets the piece's address (the buffer's plus
    256 elements) and its row stride (512) as x^T's ldb, as in the checked first call."""
    import numpy as np

    import fusionc as fc
    from benchmarks.cpu_fakes import fake_cupy_array
    from fusionc.runtime import library
    T = fc.dtype("f16")

    @fc.graph
    def half(x: T["B", 512], w: T[128, 256]):
        a, b = fc.split(x, [256, 256])
        return fc.linear(b, w)
    calls = []
    monkeypatch.setattr(library._cublas(), "cublasGemmEx",
                        lambda *a: calls.append((a[10], a[12])) or 0)
    cg = _library(half)
    x = fake_cupy_array((3, 512), np.float16)
    cg(x, fake_cupy_array((128, 256), np.float16))
    cg(x, fake_cupy_array((128, 256), np.float16))
    assert all(p.run is not None for p in cg._plans.values())
    assert calls[0] == calls[1] == (x.data.ptr + 256 * 2, 512)


def test_pieces_the_plan_cannot_pass_keep_the_general_path(fake):
    """A split piece as a GEMM's weight (cuBLAS's A takes no offset here), a split of rows
    and a reshape that a CuPy-run op (a biased GEMM) reads: no plan, the general path runs."""
    import fusionc as fc
    T = fc.dtype("f16")

    @fc.graph
    def weight_piece(x: T["B", 256], wf: T[128, 512]):
        a, b = fc.split(wf, [256, 256])
        return fc.linear(x, b)

    @fc.graph
    def row_split(x: T[4, 256]):
        a, b = fc.split(x, [1, 3], axis=0)
        return fc.silu(b)

    @fc.graph
    def reshaped(x: T["B", 4, 64], w: T[128, 256], bias: T[128]):
        return fc.linear(fc.reshape(x, ["B", 256]), w, bias)
    from fusionc.runtime import plan
    for g in (weight_piece, row_split, reshaped):
        cg = _library(g)
        assert any(op.name in plan.VIEW_OPS for op in cg.host.body), g
        assert plan._planned_run(cg, {"B": 3}, False, 0) is None, g
