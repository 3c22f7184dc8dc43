"""all_reduce over simulated ranks: the tensor-parallel MLP of examples/tp2_mlp.py."""
from pathlib import Path

import numpy as np
import pytest

import fusionc as fc
from fusionc.dsl import load_file
from fusionc.errors import InputError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def mlp_ref(x, norm_w, w_gate, w_up, w_down, eps):
    """The unsharded SwiGLU MLP with residual, float64."""
    x = x.astype(np.float64)
    h = x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + eps) * norm_w
    gate, up = h @ w_gate.T.astype(np.float64), h @ w_up.T.astype(np.float64)
    return x + (gate / (1 + np.exp(-gate)) * up) @ w_down.T.astype(np.float64)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("dtype,np_dtype,tol", [("f32", np.float32, 1e-4),
                                                ("f16", np.float16, 1e-2)])
def test_tensor_parallel_mlp_matches_unsharded(tp, dtype, np_dtype, tol):
    rng = np.random.default_rng()
    hidden, inter, B = 32, 96, 3
    s = inter // tp
    m = load_file(EXAMPLES / "tp2_mlp.py", hidden=hidden, intermediate=inter, tp=tp, dtype=dtype)
    x = rng.standard_normal((B, hidden)).astype(np_dtype)
    norm_w = (1 + 0.1 * rng.standard_normal(hidden)).astype(np_dtype)
    w_gate, w_up = (rng.standard_normal((inter, hidden)).astype(np_dtype) / 6 for _ in "gu")
    w_down = rng.standard_normal((hidden, inter)).astype(np_dtype) / 10
    per_rank = [{"x": x, "mlp_norm": norm_w,
                 "w_gate_up": np.concatenate([w_gate[r * s:(r + 1) * s], w_up[r * s:(r + 1) * s]]),
                 "w_down": w_down[:, r * s:(r + 1) * s]} for r in range(tp)]
    outs = fc.interpret(m, per_rank)
    assert len(outs) == tp
    ref = mlp_ref(x, norm_w.astype(np.float64), w_gate, w_up, w_down, 1e-5)
    for (y,) in outs:
        np.testing.assert_array_equal(y, outs[0][0])       # every rank gets the same sum
        assert rel(y, ref) <= tol
    for (y,) in fc.interpret(m, per_rank, precise=True):
        assert rel(y, ref) <= 1e-12


def _reduce_graph(group):
    return fc.trace(lambda x: fc.all_reduce(x, group), inputs={"x": fc.f16["B", 6]},
                    name="ar")


def test_groups_are_consecutive_ranks():
    rng = np.random.default_rng()
    xs = [rng.standard_normal((2, 6)).astype(np.float16) for _ in range(4)]
    outs = fc.interpret(_reduce_graph(2), [{"x": x} for x in xs])
    for r, (y,) in enumerate(outs):
        a, b = xs[r // 2 * 2], xs[r // 2 * 2 + 1]
        np.testing.assert_array_equal(y, (a.astype(np.float32) + b).astype(np.float16))


def test_sum_is_accumulated_in_fp32():
    """60000 + 60000 − 60000 − 60000: an fp16 running sum overflows to inf; fp32 gives 0."""
    xs = [np.full((1, 6), v, np.float16) for v in (60000, 60000, -60000, -60000)]
    xs[3][0, 1] = -59968                                       # the next f16 below 60000
    for (y,) in fc.interpret(_reduce_graph(4), [{"x": x} for x in xs]):
        np.testing.assert_array_equal(y[0], [0, 32, 0, 0, 0, 0])


def test_rank_count_must_fit_the_group():
    with pytest.raises(InputError, match="group of 2 ranks over 1"):
        fc.interpret(_reduce_graph(2), {"x": np.ones((1, 6), np.float16)})
    with pytest.raises(InputError, match="group of 4 ranks over 2"):
        fc.interpret(_reduce_graph(4), {"x": np.ones((1, 6), np.float16)}, ranks=2)
    (y,) = fc.interpret(_reduce_graph(1), {"x": np.ones((1, 6), np.float16)})
    assert np.all(y == 1)
