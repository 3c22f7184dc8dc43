"""rope in the interpreter against RoPE written with complex rotations (Su et al. 2021)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fusionc as fc


def rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def rope_ref(x, pos, theta, style, rot, fp32_angles):
    """Each pair (a, b) as the complex a + ib, multiplied by exp(i·p·θ_i).

    fp32_angles: θ_i rounded to float32 and p·θ_i computed as one float32 multiply (the
    documented GPU numerics); otherwise everything in float64.
    """
    x = np.asarray(x, np.float64)
    out = x.copy()
    for b in range(x.shape[0]):
        for i in range(rot // 2):
            inv = theta ** (-2.0 * i / rot)
            if fp32_angles:
                angle = float(np.float32(pos[b]) * np.float32(inv))
                rotor = complex(float(np.cos(np.float32(angle))), float(np.sin(np.float32(angle))))
            else:
                angle = pos[b] * inv
                rotor = complex(np.cos(angle), np.sin(angle))
            j, k = (i, i + rot // 2) if style == "neox" else (2 * i, 2 * i + 1)
            z = (x[b, :, j] + 1j * x[b, :, k]) * rotor
            out[b, :, j], out[b, :, k] = z.real, z.imag
    return out


def rope_graph(dtype, heads, head_dim, theta, style, rot):
    T = fc.dtype(dtype)
    return fc.trace(lambda x, p: fc.rope(x, p, theta, style, rot), name="rope",
                    inputs={"x": T["B", heads, head_dim], "p": fc.i32["B"]})


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dtype,tol", [("f32", 1e-4), ("f16", 1e-2), ("bf16", 1e-2)])
def test_partial_rotary_at_large_positions(style, dtype, tol):
    rng = np.random.default_rng()
    head_dim, rot, theta = 64, 32, 10000.0
    pos = np.array([0, 1, 17, 4095, 65537, 99999, 100000], np.int32)
    x = rng.standard_normal((len(pos), 3, head_dim)).astype(np.float32)
    if dtype == "f16":
        x = x.astype(np.float16)
    elif dtype == "bf16":
        x = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    g = rope_graph(dtype, 3, head_dim, theta, style, rot)
    (y,) = fc.interpret(g, {"x": x, "p": pos})
    assert rel(y, rope_ref(x, pos, theta, style, rot, fp32_angles=True)) <= tol
    np.testing.assert_array_equal(y[..., rot:], x[..., rot:])   # dims past rotary_dim untouched
    (yp,) = fc.interpret(g, {"x": x, "p": pos}, precise=True)
    assert rel(yp, rope_ref(x, pos, theta, style, rot, fp32_angles=False)) <= 1e-12


def test_styles_differ_and_position_zero_is_identity():
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 2, 16)).astype(np.float32)
    pos = np.array([0, 5], np.int32)
    (neox,) = fc.interpret(rope_graph("f32", 2, 16, 1e4, "neox", 16), {"x": x, "p": pos})
    (gptj,) = fc.interpret(rope_graph("f32", 2, 16, 1e4, "gptj", 16), {"x": x, "p": pos})
    np.testing.assert_allclose(neox[0], x[0], rtol=0, atol=0)
    assert not np.allclose(neox[1], gptj[1])


@given(st.sampled_from(["neox", "gptj"]), st.integers(1, 8), st.integers(0, 100000),
       st.sampled_from([10000.0, 500000.0, 1e6]))
def test_property_f32(style, half_rot, position, theta):
    rng = np.random.default_rng(position)
    rot, head_dim = 2 * half_rot, 2 * half_rot + 4
    x = rng.standard_normal((1, 2, head_dim)).astype(np.float32)
    pos = np.array([position], np.int32)
    (y,) = fc.interpret(rope_graph("f32", 2, head_dim, theta, style, rot), {"x": x, "p": pos})
    assert rel(y, rope_ref(x, pos, theta, style, rot, fp32_angles=True)) <= 1e-5
    # a rotation keeps the norm of every head vector
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
