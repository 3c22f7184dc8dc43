"""The SwiGLU MLP of examples/llama2_7b.py (small sizes) against numpy; linear, silu, cast."""
from pathlib import Path

import numpy as np
import pytest

import fusionc as fc
from fusionc.dsl import load_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def storable(x, dtype: str) -> np.ndarray:
    if dtype == "f16":
        return np.asarray(x, np.float16)
    x = np.asarray(x, np.float32)
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32) if dtype == "bf16" else x


def swiglu_mlp_ref(x, norm_w, w_gate_up, w_down, eps):
    """x + W_down (silu(W_gate h) ⊙ W_up h), h = RMSNorm(x) (Shazeer 2020), float64."""
    x, norm_w, w_gate_up, w_down = (np.asarray(a, np.float64)
                                    for a in (x, norm_w, w_gate_up, w_down))
    h = x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + eps) * norm_w
    inter = w_down.shape[1]
    gate, up = h @ w_gate_up[:inter].T, h @ w_gate_up[inter:].T
    return x + (gate / (1 + np.exp(-gate)) * up) @ w_down.T


def mlp_inputs(rng, B, hidden, inter, dtype):
    return {"x": storable(rng.standard_normal((B, hidden)), dtype),
            "mlp_norm": storable(1 + 0.1 * rng.standard_normal(hidden), dtype),
            "w_gate_up": storable(rng.standard_normal((2 * inter, hidden)) / np.sqrt(hidden),
                                  dtype),
            "w_down": storable(rng.standard_normal((hidden, inter)) / np.sqrt(inter), dtype)}


@pytest.mark.parametrize("dtype,tol", [("f32", 1e-4), ("f16", 1e-2), ("bf16", 1e-2)])
def test_swiglu_mlp_example(dtype, tol):
    rng = np.random.default_rng()
    hidden, inter = 64, 160
    m = load_file(EXAMPLES / "llama2_7b.py", hidden=hidden, heads=2, head_dim=32,
                  intermediate=inter, max_seq=8, dtype=dtype)
    ins = mlp_inputs(rng, 5, hidden, inter, dtype)
    (y,) = fc.interpret(m, ins, graph="mlp")
    ref = swiglu_mlp_ref(ins["x"], ins["mlp_norm"], ins["w_gate_up"], ins["w_down"], 1e-5)
    assert y.shape == (5, hidden)
    assert rel(y, ref) <= tol
    (yp,) = fc.interpret(m, ins, graph="mlp", precise=True)
    assert rel(yp, ref) <= 1e-12


def test_linear_with_bias_silu_and_cast():
    rng = np.random.default_rng()

    @fc.graph
    def g(x: fc.f32["B", 2, 8], w: fc.f32[5, 8], b: fc.f32[5]):
        y = fc.linear(x, w, b)
        return fc.silu(y), fc.cast(y, "f16"), fc.cast(y, fc.bf16)

    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    w = rng.standard_normal((5, 8)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    s, h, bf = fc.interpret(g, {"x": x, "w": w, "b": b})
    y = np.einsum("bik,nk->bin", x.astype(np.float64), w.astype(np.float64)) + b
    assert rel(s, y / (1 + np.exp(-y))) <= 1e-5
    assert h.dtype == np.float16 and rel(h, y) <= 1e-3
    assert bf.dtype == np.float32 and not (bf.view(np.uint32) & 0xFFFF).any()
    assert rel(bf, y) <= 1e-2
