"""rms_norm in the interpreter against a plain numpy RMSNorm."""
import numpy as np
import pytest

import fusionc as fc

TOL = {"f32": 1e-4, "f16": 1e-2, "bf16": 1e-2}


def rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def storable(x, dtype: str) -> np.ndarray:
    """x made exactly representable in ``dtype`` (bf16: low 16 bits of float32 cleared)."""
    if dtype == "f16":
        return np.asarray(x, np.float16)
    x = np.asarray(x, np.float32)
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32) if dtype == "bf16" else x


def rms_norm_ref(x, w, eps):
    """Zhang & Sennrich 2019, eq. 4, in float64, row by row."""
    x = np.asarray(x, np.float64)
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        out[idx] = row / np.sqrt(np.sum(row * row) / row.size + eps) * np.asarray(w, np.float64)
    return out


def norm_graph(dtype, shape, eps):
    T = fc.dtype(dtype)
    return fc.trace(lambda x, w: fc.rms_norm(x, w, eps),
                    inputs={"x": T[shape], "w": T[shape[-1]]}, name="norm")


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", [("B", 96), ("B", 4, 32)])
def test_random_inputs(dtype, shape):
    rng = np.random.default_rng()
    concrete = tuple(3 if d == "B" else d for d in shape)
    x = storable(rng.standard_normal(concrete) * 3, dtype)
    w = storable(rng.standard_normal(shape[-1]), dtype)
    (y,) = fc.interpret(norm_graph(dtype, shape, 1e-5), {"x": x, "w": w})
    assert y.shape == concrete
    assert rel(y, rms_norm_ref(x, w, 1e-5)) <= TOL[dtype]
    (yp,) = fc.interpret(norm_graph(dtype, shape, 1e-5), {"x": x, "w": w}, precise=True)
    assert yp.dtype == np.float64 and rel(yp, rms_norm_ref(x, w, 1e-5)) <= 1e-12


def test_fp16_inputs_whose_squares_overflow_fp16():
    """300² = 90000 > 65504: an fp16 sum of squares would be inf; fp32 gives exactly w."""
    rng = np.random.default_rng()
    x = np.full((2, 256), 300, np.float16)
    x[1] = -300
    w = (rng.standard_normal(256) + 0.1).astype(np.float16)
    (y,) = fc.interpret(norm_graph("f16", ("B", 256), 1e-6), {"x": x, "w": w})
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y[0], w)
    np.testing.assert_array_equal(y[1], -w)


def test_all_zero_row_gives_zeros_and_other_rows_are_unaffected():
    rng = np.random.default_rng()
    x = rng.standard_normal((3, 64)).astype(np.float16)
    x[1] = 0
    w = rng.standard_normal(64).astype(np.float16)
    (y,) = fc.interpret(norm_graph("f16", ("B", 64), 1e-5), {"x": x, "w": w})
    assert np.all(y[1] == 0) and np.all(np.isfinite(y))
    ref = rms_norm_ref(x, w, 1e-5)
    assert rel(y[[0, 2]], ref[[0, 2]]) <= 1e-2
