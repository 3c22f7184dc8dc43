"""The cached call path (issue 23) on the GPU: planned calls compute what checked calls do, with
new pointers each time; changed arguments on a later call get the first call's error; planned
GEMM graphs and in-place KV caches; a planned call captured in a CUDA graph."""
import numpy as np
import pytest

from fusionc.errors import InputError
from tests.gpu import compiled_cases as cc
from tests.gpu.common import record, torch_capture
from tests.passes.graphs import inputs as random_inputs

pytestmark = pytest.mark.gpu

SIZES = dict(hidden=256, heads=2, head_dim=128, intermediate=512, max_seq=64)


def _mlp():
    m = cc.example("llama2_7b", **SIZES, dtype="f16")
    return m["mlp"], cc.fusionc_compile(m, "mlp", 4)


def _args(g, batch=2, seed=0):
    return cc.upload(g, random_inputs(g, batch, [1] * batch, np.random.default_rng(seed)))


def test_planned_calls_match_checked_calls():
    import cupy
    g, fn = _mlp()
    a, b = _args(g, seed=0), _args(g, seed=1)
    (ya,) = fn(**a)   # checked: records the plan
    (yb,) = fn(**b)   # planned, other buffers
    (ya2,) = fn(**a)
    assert len(fn._plans) == 1 and ya2.data.ptr != ya.data.ptr
    cupy.testing.assert_array_equal(ya, ya2)
    (_, fresh) = _mlp()
    cupy.testing.assert_array_equal(fresh(**b)[0], yb)
    record("call cache", "MLP planned vs checked", "equal")


def _misaligned(x):
    import cupy
    flat = cupy.empty(x.size + 1, x.dtype)
    view = flat[1:].reshape(x.shape)
    view[...] = x
    return view


@pytest.mark.parametrize("mutate", [
    lambda a: a.update(x=_misaligned(a["x"])),
    lambda a: a.update(w_down=a["w_down"][:, ::2]),
    lambda a: a.update(x=a["x"].astype("float32")),
    lambda a: a.update(x=a["x"][:1, :128].copy()),
], ids=["misaligned", "strided", "dtype", "shape"])
def test_changed_arguments_get_the_first_call_error(mutate):
    g, warm = _mlp()
    a = _args(g)
    warm(**a)
    warm(**a)
    bad = dict(a)
    mutate(bad)
    with pytest.raises(InputError) as first:
        _mlp()[1](**bad)
    with pytest.raises(InputError) as again:
        warm(**bad)
    assert str(first.value) == str(again.value)


def test_planned_gemm_and_in_place_caches():
    import cupy
    torch = pytest.importorskip("torch")
    import fusionc as fc
    T = fc.dtype("f16")

    @fc.graph
    def lin(x: T["B", 256], w: T[128, 256]):
        return fc.linear(x, w)
    fn = fc.compile(lin, max_batch=4)
    x = torch.randn(3, 256, device="cuda", dtype=torch.float16)
    w = torch.randn(128, 256, device="cuda", dtype=torch.float16)
    fn(x, w)
    (y,) = fn(x, w)   # planned cuBLAS call
    ref = (x.float() @ w.float().T)
    assert float((y.float() - ref).norm() / ref.norm()) < 1e-2
    m = cc.example("llama2_7b", **SIZES, dtype="f16")
    att = cc.fusionc_compile(m, "attention", 2)
    g = m["attention"]
    a = _args(g)
    att(**a)
    a["positions"] = cupy.asarray(np.array([5, 7], np.int32))
    a["seq_lens"] = cupy.asarray(np.array([6, 8], np.int32))
    before = a["k_cache"].copy()
    _, k_cache, _ = att(**a)   # planned: appends at the new positions, in place
    assert k_cache is a["k_cache"]
    assert not cupy.array_equal(k_cache[0, 5], before[0, 5], equal_nan=True)
    assert cupy.array_equal(k_cache[0, 6], before[0, 6], equal_nan=True)  # NaN past the length
    record("call cache", "planned cuBLAS GEMM, planned KV append", "ok")


def test_planned_call_captured_in_a_cuda_graph():
    torch = pytest.importorskip("torch")
    g, fn = _mlp()
    host = random_inputs(g, 2, [1, 1], np.random.default_rng(3))
    t = {k: torch.tensor(v).to(torch.float16 if v.dtype.kind == "f" else torch.int32).cuda()
         for k, v in host.items()}
    eager, captured = torch_capture(fn, t)   # the captured call is planned
    assert torch.equal(captured, eager) and len(fn._captured) == 1


def test_pooled_torch_outputs_stay_independent():
    """Every kept torch output of a planned call holds its own call's result, on the default
    stream and on a second one."""
    torch = pytest.importorskip("torch")
    g, fn = _mlp()
    seeds = [random_inputs(g, 2, [1, 1], np.random.default_rng(s)) for s in range(3)]
    args = [{k: torch.tensor(v).to(torch.float16 if v.dtype.kind == "f" else torch.int32).cuda()
             for k, v in h.items()} for h in seeds]
    first = [fn(**a)[0].clone() for a in args]
    kept = [(i % 3, fn(**args[i % 3])[0]) for i in range(40)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kept += [(i % 3, fn(**args[i % 3])[0]) for i in range(40)]
    torch.cuda.synchronize()
    assert len({y.data_ptr() for _, y in kept}) == len(kept)
    for i, y in kept:
        assert torch.equal(y, first[i])
    record("call cache", "80 pooled torch outputs kept, two streams", "equal")
