"""The cached call path of ``fusionc.compile`` callables (issue 23), on the CPU with a fake GPU
(``benchmarks/cpu_fakes.py``): a second call with the same argument signature launches from
its plan with the new pointers; a changed shape, dtype, device, layout or alignment on a later
call is caught with the error (type and message) of a first call; bad first calls give the
errors of the checked path."""
# no `from __future__ import annotations`: the DSL evaluates the annotations

import ctypes

import numpy as np
import pytest

from benchmarks import cpu_fakes
from benchmarks.cpu_fakes import FakeTensor, fake_cupy_array, launched_args
from fusionc.errors import FusionError, InputError
from tests.passes.graphs import example

SIZES = dict(hidden=256, heads=2, head_dim=128, intermediate=512, max_seq=64)


@pytest.fixture(scope="module")
def module():
    return example("llama2_7b", **SIZES, dtype="f16")


@pytest.fixture
def gpu():
    with cpu_fakes.fake_gpu() as cu:
        yield cu


def _compile(module, graph="mlp", max_batch=4):
    """The attention block's three kernels (QKV, the attention units, O), the MLP as one
    chained kernel (its SwiGLU intermediate a scratch buffer of the graph)."""
    import fusionc
    from fusionc.passes.stream import v2_pipeline
    if graph == "attention":
        return fusionc.compile(module, graph, max_batch=max_batch)
    return fusionc.compile(module, graph, max_batch=max_batch, lowering="v2",
                           pipeline=v2_pipeline(max_batch, chain=True))


def _args(cg, batch=2, torch=False, **over):
    from fusionc.runtime.arrays import _CUPY, _TORCH
    out = {}
    for p in cg.host.params:
        shape, dt = p.type.concrete({"B": batch}), p.type.dtype
        out[p.name] = FakeTensor(shape, _TORCH[dt]) if torch else fake_cupy_array(
            shape, _CUPY[dt])
    out.update(over)
    return out


def _kinds(cg):
    (k,) = cg.kernels.values()
    return [p.kind for p in k.source.params]


def _error(fn, *args, **kwargs):
    with pytest.raises(FusionError) as e:
        fn(*args, **kwargs)
    return type(e.value), str(e.value)


def test_second_call_launches_from_the_plan_with_new_pointers(module, gpu):
    cg = _compile(module)
    a, b = _args(cg), _args(cg)
    (y1,) = cg(**a)
    first = launched_args(gpu.last[2], _kinds(cg))
    assert len(cg._plans) == 1
    (y2,) = cg(**b)
    second = launched_args(gpu.last[2], _kinds(cg))
    assert gpu.launches == 2 and len(cg._plans) == 1
    (k,) = cg.kernels.values()
    ptr = {**{n: x.data.ptr for n, x in a.items()}, "0": y1.data.ptr}
    ptr2 = {**{n: x.data.ptr for n, x in b.items()}, "0": y2.data.ptr}
    names = [p.value.name if p.kind == "tensor" else None for p in k.source.params]
    op = cg.host.body[0]
    kg = cg.module[op.attr("kernel").name]
    host_of = {p.name: v.name for p, v in zip(kg.params, op.operands)}
    host_of.update({v.name: r.name for v, r in zip(kg.outputs, op.results)})
    for i, n in enumerate(names):
        if n is None or host_of.get(n) not in ptr:
            assert first[i] == second[i]   # dims, workspace, counters, scratch: unchanged
        else:
            assert first[i] == ptr[host_of[n]] and second[i] == ptr2[host_of[n]]
    assert y1.shape == y2.shape == (2, SIZES["hidden"]) and y1.data.ptr != y2.data.ptr


def test_positional_and_keyword_calls_share_the_plan(module, gpu):
    cg = _compile(module)
    a = _args(cg)
    cg(**a)
    names = list(a)
    cg(*[a[n] for n in names])
    cg(a[names[0]], **{n: a[n] for n in reversed(names[1:])})
    assert gpu.launches == 3 and len(cg._plans) == 1


def _misaligned(shape, dtype):
    return fake_cupy_array(shape, dtype, ptr=cpu_fakes.alloc_address(1 << 20) + 2)


def _strided(shape, dtype):
    wide = fake_cupy_array((shape[0], 2 * shape[1]), dtype)
    return wide[:, ::2]


H, I = SIZES["hidden"], SIZES["intermediate"]
BAD = {   # argument changes on the second call -> the message of the checked path
    "shape": (lambda: dict(x=fake_cupy_array((2, 128), "float16")), "has shape"),
    "dtype": (lambda: dict(x=fake_cupy_array((2, H), "float32")), "has dtype float32"),
    "device": (lambda: dict(x=fake_cupy_array((2, H), "float16", device=1)), "is on GPU 1"),
    "numpy": (lambda: dict(x=np.zeros((2, H), np.float16)), "is a ndarray"),
    "strided": (lambda: dict(w_down=_strided((H, I), "float16")), "is not contiguous"),
    "misaligned": (lambda: dict(x=_misaligned((2, H), "float16")), "not 16-byte aligned"),
    "batch": (lambda: dict(x=fake_cupy_array((8, H), "float16")),
              "exceeds the compiled batch bucket"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_changed_argument_caught_like_on_a_first_call(module, gpu, case):
    make, msg = BAD[case]
    warm = _compile(module)
    good = _args(warm)
    warm(**good)
    warm(**good)   # planned
    bad = {**good, **make()}
    if case == "batch":   # every B-typed argument at batch 8
        bad = _args(warm, 8)
    cold = _compile(module)
    first = _error(cold, **bad)
    again = _error(warm, **bad)
    assert first == again and first[0] is InputError and msg in first[1]
    warm(**good)   # the plan still serves good calls
    assert gpu.launches == 3


TORCH_BAD = {
    "cpu": (lambda: FakeTensor((2, H), "float16", device=None), "is on cpu"),
    "device": (lambda: FakeTensor((2, H), "float16", device=1), "is on cuda:1"),
    "dtype": (lambda: FakeTensor((2, H), "bfloat16"), "has dtype torch.bfloat16"),
    "strided": (lambda: FakeTensor((2, H), "float16", contiguous=False), "is not contiguous"),
    "misaligned": (lambda: FakeTensor((2, H), "float16",
                                      ptr=cpu_fakes.alloc_address(1 << 16) + 8),
                   "not 16-byte aligned"),
    "shape": (lambda: FakeTensor((2, 128), "float16"), "has shape"),
}


@pytest.mark.parametrize("case", sorted(TORCH_BAD))
def test_changed_torch_argument_caught_like_on_a_first_call(module, gpu, case):
    make, msg = TORCH_BAD[case]
    warm = _compile(module)
    good = _args(warm, torch=True)
    warm(**good)
    warm(**good)
    bad = {**good, "x": make()}
    first, again = _error(_compile(module), **bad), _error(warm, **bad)
    assert first == again and first[0] is InputError and msg in first[1]


def test_bad_first_calls_keep_their_errors(module, gpu):
    cg = _compile(module)
    a = _args(cg)
    missing = {k: v for k, v in a.items() if k != "mlp_norm"}
    assert _error(cg, **missing) == (InputError, "input error: 'mlp': missing arguments "
                                     "['mlp_norm'] (valid: x, mlp_norm, w_gate_up, w_down)")
    assert "unexpected or repeated argument 'bogus'" in _error(cg, **a, bogus=a["x"])[1]
    assert "5 positional arguments" in _error(cg, *a.values(), a["x"])[1]
    assert "repeated argument 'x'" in _error(cg, a["x"], **a)[1]
    assert _error(cg, **{**a, "x": _strided((2, H), "float16")}) == (
        InputError, "input error: 'mlp': argument 'x' is not contiguous "
                    "(valid: a C-contiguous (row-major) tensor; call .contiguous())")
    assert gpu.launches == 0 and not cg._plans
    out = fake_cupy_array((1, 8), "float16")
    cg(**a)
    msg = _error(cg, **a, outputs={"0": out})[1]   # given outputs: still checked per call
    assert "output '0' has shape [1, 8]" in msg
    assert "outputs= is a list" in _error(cg, **a, outputs=[out])[1]


def test_capture_keeps_the_buffers_of_planned_calls(module, gpu):
    cg = _compile(module)
    a = _args(cg, torch=True)
    cg(**a)
    cpu_fakes.STREAM.capturing = True
    (y,) = cg(**a)
    cpu_fakes.STREAM.capturing = False
    assert len(cg._captured) == 1 and y in cg._captured[0]
    cg(**a)
    assert len(cg._captured) == 1
    cg.forget_captures()   # the captured graph is gone (Decoder.load): nothing kept
    assert not cg._captured


def test_attention_kernels_then_library_linear(module, gpu, monkeypatch):
    """Attention (in-place KV caches) and a GEMM graph take the planned path too."""
    import fusionc as fc
    from fusionc.runtime import library
    cg = _compile(module, "attention")
    a = _args(cg)
    out1 = cg(**a)
    out2 = cg(**a)
    assert out2[1] is a["k_cache"] and out2[2] is a["v_cache"] and out1[0] is not out2[0]
    T = fc.dtype("f16")

    @fc.graph
    def lin(x: T["B", 256], w: T[128, 256]):
        return fc.linear(x, w)
    calls = []
    fake = library._cublas()
    monkeypatch.setattr(fake, "cublasGemmEx", lambda *args: calls.append(args) or 0)
    g = fc.compile(lin, max_batch=4, pipeline="fold-views,lower-library")   # a GEMM
    x, w = fake_cupy_array((3, 256), "float16"), fake_cupy_array((128, 256), "float16")
    (y1,) = g(x, w)
    (y2,) = g(x, w)
    assert len(g._plans) == 1 and len(calls) == 2 and calls[0][3:6] == calls[1][3:6] == (
        128, 3, 256)
    for c, y in zip(calls, (y1, y2)):
        assert (c[7], c[10], c[14]) == (w.data.ptr, x.data.ptr, y.data.ptr)


def test_loaded_kernel_launch_keeps_its_checks(module, gpu):
    from fusionc.runtime.launch import LoadedKernel
    cg = _compile(module)
    (ck,) = cg.kernels.values()
    lk = LoadedKernel(ck)
    t = {v.name: fake_cupy_array(v.type.concrete({"B": 2}),
                                 "float16") for v in ck.source.kernel.params}
    lk.launch(t, {"B": 2})
    lk.launch(t, {"B": 2})
    assert gpu.launches == 2
    first = list(t)[0]
    with pytest.raises(InputError, match=f"missing argument %{first}"):
        lk.launch({k: v for k, v in t.items() if k != first}, {"B": 2})
    with pytest.raises(InputError, match="symbolic dim B = 9"):
        lk.launch({k: fake_cupy_array(v.shape[:0] + (9,) + v.shape[1:], "float16")
                   if v.shape[0] == 2 else v for k, v in t.items()}, {"B": 9})
    with pytest.raises(InputError, match=f"%{first} is float16"):
        lk.launch({**t, first: fake_cupy_array((1, 3), "float16")}, {"B": 2})
    with pytest.raises(InputError, match="not 16-byte aligned"):
        lk.launch({**t, first: _misaligned(t[first].shape, "float16")}, {"B": 2})


def test_packer_table_takes_a_new_kind():
    """A parameter kind added to the packer table (e.g. a tensor map following a weight's
    pointer) gets its storage rewritten at every launch."""
    from types import SimpleNamespace

    from fusionc.runtime.params import PACKERS, ArgPack, PackContext, Slot
    seen = []

    def custom128(p, ctx):
        def update(storage, ptr):
            seen.append(ptr)
            storage[0] = ptr & 0xFF
        return Slot((ctypes.c_ubyte * 128)(), tensor=p.value.name, update=update)
    v = SimpleNamespace(name="w")
    params = [SimpleNamespace(kind="tensor", name="x", value=SimpleNamespace(name="x")),
              SimpleNamespace(kind="custom128", name="w_custom", value=v),
              SimpleNamespace(kind="workspace", name="fc_ws")]
    ctx = PackContext(SimpleNamespace(name="k"), 0x1000, 0x2000, {}, (-1, 0))
    with pytest.raises(InputError, match="kind 'custom128'"):
        ArgPack(params, ctx)
    pack = ArgPack(params, ctx, {**PACKERS, "custom128": custom128})
    assert pack.names == ("x", "w")
    pack.fill([0x5000, 0x6012])
    assert seen == [0x6012] and pack.values() == [0x5000, 0x12, 0x1000]


def test_a_host_op_on_integers_is_named_at_compile_time():
    """cast runs as a row kernel on the library path: float operands only."""
    import fusionc as fc
    from fusionc.errors import CompileError

    @fc.graph
    def g(x: fc.i32["B", 8]):
        return fc.cast(x, "f16")
    with pytest.raises(CompileError, match="'cast' on i32"):
        fc.compile(g, max_batch=300)


@pytest.mark.parametrize("chain", [True, False])
def test_v2_intermediates_are_reused_scratch(module, gpu, chain):
    """The v2 MLP (one kernel of two phases, or two kernels under PDL) hands its SwiGLU output
    from gate/up to down in a scratch buffer made on the first call and reused by planned and
    unplanned calls (a captured decode step must allocate nothing)."""
    import fusionc
    from fusionc.passes.stream import v2_pipeline
    cg = fusionc.compile(module, "mlp", max_batch=8, lowering="v2",
                         pipeline=v2_pipeline(8, chain=chain))
    assert [op.name for op in cg.host.body] == ["launch"] * (1 if chain else 2)
    a = _args(cg)
    cg(**a)
    buf, = cg._scratch.values()
    cg(**a)   # planned
    y = fake_cupy_array((2, SIZES["hidden"]), "float16")
    cg(**a, outputs={"0": y})   # the general path
    cg(**_args(cg, batch=1))   # a smaller batch: the buffer's leading rows
    assert len(cg._scratch) == 1 and next(iter(cg._scratch.values())) is buf
    assert gpu.launches == 4 * len(cg.host.body)
    cg(**_args(cg, batch=8))   # a larger batch regrows the one buffer
    big, = cg._scratch.values()
    assert big.size == 8 * SIZES["intermediate"] > buf.size


def test_library_path_intermediates_are_scratch_and_memory_stays_bounded(module, gpu,
                                                                           monkeypatch):
    """The library path (the v2 MLP at 64 rows: RMSNorm, GEMM, split, SiLU·mul, GEMM, add):
    a warm call given its output allocates nothing (a decode step captured with no allocator
    works), and batches of many sizes keep one buffer per intermediate."""
    import fusionc
    from fusionc.runtime import arrays, library
    for f in ("rms_norm", "silu_mul", "add", "gemm"):
        monkeypatch.setattr(library, f, lambda *a, **k: None)
    cg = fusionc.compile(module, "mlp", max_batch=64)
    assert not cg.kernels
    y = fake_cupy_array((40, SIZES["hidden"]), "float16")
    cg(**_args(cg, batch=40), outputs={"0": y})
    made = []
    real = arrays.empty_like_inputs
    monkeypatch.setattr(arrays, "empty_like_inputs", lambda *a, **k: made.append(a) or real(*a))
    cg(**_args(cg, batch=40), outputs={"0": y})
    assert made == []
    for b in (64, 3, 17, 64, 50):
        cg(**_args(cg, batch=b))
    names = sorted(k[0] for k in cg._scratch)
    assert len(names) == len(set(names)) and max(x.size for x in cg._scratch.values()) <= \
        64 * 2 * SIZES["intermediate"]



class _RecordingComm:
    """Two ranks; records each all-reduce's operand and output addresses and options."""

    world = 2

    def __init__(self):
        self.calls = []

    def all_reduce(self, *ins, out_y=None, out_h=None, **kw):
        ptr = lambda a: None if a is None else a.data.ptr
        self.calls.append(([ptr(a) if hasattr(a, "data") else a for a in ins], ptr(out_y),
                           ptr(out_h), kw))


@pytest.mark.parametrize("torch", [False, True])
def test_collectives_on_the_callers_stream_are_planned(gpu, torch):
    """A tensor-parallel layer (launches and two all-reduces) runs from its plan after the
    first call: the collectives get the same scratch buffers, argument views and options as on
    the checked first call, and each call's graph output is a new buffer."""
    import fusionc
    from fusionc.models.blocks import tp_layer_block
    m = tp_layer_block(hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512, tp=2,
                       max_seq=64, eps=1e-5, theta=1e4, dtype="f16")
    cg = fusionc.compile(m, max_batch=2)
    cg.comm = comm = _RecordingComm()
    a = _args(cg, torch=torch)
    out1, out2 = cg(**a), cg(**a)
    (plan,) = cg._plans.values()
    assert plan.run is not None and len(comm.calls) == 4
    first, second = comm.calls[:2], comm.calls[2:]
    assert [c[3] for c in first] == [c[3] for c in second]
    assert first[0] == second[0]   # residual x and the norm weight: argument views; y, h scratch
    ins1, _, h1, _ = first[1]
    ins2, _, h2, _ = second[1]
    assert ins1 == ins2 and h1 != h2   # the layer's output: a new buffer per call
    ptr = (lambda t: t.data_ptr()) if torch else (lambda t: t.data.ptr)
    assert ptr(out1[0]) == h1 and ptr(out2[0]) == h2
    import weakref
    gone = weakref.ref(out2[0])
    del out1, out2
    assert gone() is None   # the plan keeps no buffer of a finished call
    comm.world = 4
    with pytest.raises(InputError, match="group = 2 but the communicator has 4 ranks"):
        cg(**a)
    cg.comm = None
    with pytest.raises(InputError, match="no communicator"):
        cg(**a)


@pytest.mark.parametrize("torch", [False, True])
def test_host_ops_are_planned(gpu, torch, monkeypatch):
    """The library path's host ops (RMSNorm, a GEMM, SiLU, add: row kernels and cuBLAS) run
    from the plan after the first call, with the same buffers as the checked first call: the
    arguments, the graph's scratch intermediates, and a new output buffer per call."""
    import fusionc
    from benchmarks.host_overhead_cpu import host_ops_graph
    from fusionc.runtime import library, row_kernels
    calls = []
    launch = row_kernels.RowLaunch.__call__
    monkeypatch.setattr(row_kernels.RowLaunch, "__call__", lambda self, ptrs, stream: (
        calls.append((self.name, tuple(ptrs))), launch(self, ptrs, stream))[1])
    monkeypatch.setattr(library._cublas(), "cublasGemmEx",
                        lambda *a: calls.append(("gemm", (a[7], a[10], a[14]))) or 0)
    cg = fusionc.compile(host_ops_graph(), max_batch=4, pipeline="fold-views,lower-library")
    a = _args(cg, torch=torch)
    (y1,), (y2,) = cg(**a), cg(**a)
    (plan,) = cg._plans.values()
    assert plan.run is not None and [c[0] for c in calls] == [
        "fc_rms_norm_f16", "gemm", "fc_silu_f16", "fc_add_f16"] * 2
    first, second = calls[:4], calls[4:]
    assert first[:3] == second[:3]   # x, the weights and the scratch intermediates
    ptr = (lambda t: t.data_ptr()) if torch else (lambda t: t.data.ptr)
    assert first[3][1][:2] == second[3][1][:2] and \
        (first[3][1][2], second[3][1][2]) == (ptr(y1), ptr(y2)) and ptr(y1) != ptr(y2)
    with pytest.raises(InputError, match="has shape"):   # a changed shape: the checked path
        cg(**_args(cg, torch=torch, x=(FakeTensor((2, 512), "float16") if torch else
                                       fake_cupy_array((2, 512), "float16"))))
    cpu_fakes.STREAM.capturing = True
    try:
        cg(**a)
    finally:
        cpu_fakes.STREAM.capturing = False
    kept = {o.data_ptr() if hasattr(o, "data_ptr") else o.data.ptr for o in cg._captured[-1]}
    n, h = first[0][1][2], first[1][1][2]   # RMSNorm's output, the GEMM's output
    assert {n, h} <= kept   # a capture keeps the plan's scratch buffers alive


def test_biased_linear_is_planned(gpu, monkeypatch):
    """A GEMM with a bias (cuBLAS after the bias's broadcast) runs from the plan too."""
    import fusionc as fc
    from fusionc.runtime import library
    T = fc.dtype("f16")

    @fc.graph
    def lin(x: T["B", 256], w: T[128, 256], b: T[128]):
        return fc.linear(x, w, b)
    calls = []
    monkeypatch.setattr(library, "gemm", lambda x, w, out, dt, *rest, **kw: calls.append(
        (x.data.ptr, w.data.ptr, out.data.ptr, rest[0].data.ptr, dt, kw)))
    g = fc.compile(lin, max_batch=4, pipeline="fold-views,lower-library")
    x, w, b = (fake_cupy_array(s, "float16") for s in ((3, 256), (128, 256), (128,)))
    (y1,), (y2,) = g(x, w, b), g(x, w, b)
    (plan,) = g._plans.values()
    assert plan.run is not None and len(calls) == 2
    assert calls[0][:2] == calls[1][:2] == (x.data.ptr, w.data.ptr)
    assert (calls[0][2], calls[1][2]) == (y1.data.ptr, y2.data.ptr) and calls[0][3:] == calls[1][3:]
