"""The runtime contract of fusionc.compile on the GPU: clear errors for bad arguments, CuPy and
PyTorch (bf16 too) arguments without copies, given outputs, the batch bucket, CUDA graphs."""
import numpy as np
import pytest

from fusionc.errors import InputError
from tests.gpu import compiled_cases as cc
from tests.gpu.common import record
from tests.passes.graphs import inputs as random_inputs

pytestmark = pytest.mark.gpu

SIZES = dict(hidden=256, heads=2, head_dim=128, intermediate=512, max_seq=64)


def _mlp(dtype="f16", max_batch=4):
    m = cc.example("llama2_7b", **SIZES, dtype=dtype)
    return m["mlp"], cc.fusionc_compile(m, "mlp", max_batch)


def _args(g, batch=2):
    return cc.upload(g, random_inputs(g, batch, [1] * batch, np.random.default_rng(0)))


@pytest.mark.parametrize("mutate,msg", [
    (lambda a: a.update(x=a["x"][:, :128].copy()), "has shape"),
    (lambda a: a.update(x=a["x"].astype("float32")), "has dtype float32"),
    (lambda a: a.update(x=a["x"].get()), "is a ndarray"),
    (lambda a: a.update(w_down=a["w_down"][:, ::2]), "is not contiguous|has shape"),
    (lambda a: a.update(x=_misaligned(a["x"])), "not 16-byte aligned"),
    (lambda a: a.pop("mlp_norm"), "missing arguments"),
    (lambda a: a.update(bogus=a["x"]), "unexpected or repeated argument 'bogus'"),
])
def test_bad_arguments_are_refused(mutate, msg):
    g, fn = _mlp()
    a = _args(g)
    mutate(a)
    with pytest.raises(InputError, match=msg):
        fn(**a)


def _misaligned(x):
    import cupy
    flat = cupy.empty(x.size + 1, x.dtype)
    view = flat[1:].reshape(x.shape)
    view[...] = x
    return view


def test_batch_over_the_bucket_is_refused():
    g, fn = _mlp(max_batch=2)
    with pytest.raises(InputError, match="exceeds the compiled batch bucket"):
        fn(**_args(g, batch=3))


def test_given_outputs_and_smaller_batches():
    import cupy
    g, fn = _mlp(max_batch=4)
    for batch in (1, 3, 4):  # one compiled bucket serves every batch up to it
        a = _args(g, batch)
        out = cupy.full((batch, SIZES["hidden"]), np.nan, cupy.float16)
        (got,) = fn(**a, outputs={g.outputs[0].name: out})
        assert got is out and not cupy.isnan(out).any()
    with pytest.raises(InputError, match="has shape"):
        fn(**a, outputs={g.outputs[0].name: cupy.empty((1, 8), cupy.float16)})


def test_torch_tensors_bf16_and_cuda_graph_capture():
    torch = pytest.importorskip("torch")
    from fusionc.interp import interpret
    g, fn = _mlp(dtype="bf16")
    host = random_inputs(g, 2, [1, 1], np.random.default_rng(1))
    t = {k: torch.tensor(v).to(torch.bfloat16 if v.dtype.kind == "f" else torch.int32).cuda()
         for k, v in host.items()}
    (out,) = fn(**t)
    assert out.dtype == torch.bfloat16 and out.shape == (2, SIZES["hidden"])
    ref = interpret(g, host, precise=True)[0]
    assert cc.rel(out.float().cpu().numpy(), ref) <= 1e-2
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn(**t)  # warm up on the capture stream
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        (captured,) = fn(**t)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, out)
    with pytest.raises(InputError, match="is on cpu"):
        fn(**{**t, "x": t["x"].cpu()})
    record("runtime", "torch bf16 + CUDA graph replay", "equal to the eager call")


def test_fusionc_run_command(capsys):
    from fusionc.cli import main
    rc = main(["run", str(cc.EXAMPLES / "llama2_7b.py"), "--batch", "2", "--kv-len", "300",
               "-D", "hidden=512", "-D", "heads=4", "-D", "intermediate=1024", "--reps", "5"])
    out = capsys.readouterr().out
    record("runtime", "fusionc run llama2_7b (reduced) B2 KV300", out.strip().replace("\n", " | "))
    assert rc == 0 and out.count(" ok;") == 2
