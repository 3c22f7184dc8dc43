"""The interpreter loop: input binding, graph selection, dtypes of results, shape ops."""
import numpy as np
import pytest

import fusionc as fc
from fusionc.errors import InputError
from fusionc.interp.numerics import relative_error, round_bf16
from fusionc.ir import lookup, parse_module

DSL_OPS = ["add", "mul", "silu", "silu_mul", "cast", "rms_norm", "linear", "reshape", "split",
           "rope", "kv_cache_append", "decode_attention", "all_reduce"]


def test_every_graph_op_has_an_interpreter_rule():
    assert all(lookup(name).interpret is not None for name in DSL_OPS)


@fc.graph
def two_out(x: fc.bf16["B", 6], w: fc.bf16[6]):
    a, b = fc.split(x, [2, 4])
    return fc.reshape(b, "B", 2, 2), fc.rms_norm(x, w, 1e-6)


def test_shape_ops_and_bf16_results():
    rng = np.random.default_rng()
    x = rng.standard_normal((3, 6)).astype(np.float32)
    r, n = fc.interpret(two_out, {"x": x, "w": np.ones(6, np.float32)})
    xb = round_bf16(x)          # inputs are rounded to the param dtype
    np.testing.assert_array_equal(r, xb[:, 2:].reshape(3, 2, 2))
    assert n.dtype == np.float32 and not (n.view(np.uint32) & 0xFFFF).any()
    rp, _ = fc.interpret(two_out, {"x": x, "w": np.ones(6)}, precise=True)
    assert rp.dtype == np.float64


def test_interpret_parsed_text_graph():
    m = parse_module("""
    graph @f(%a: f32[B, 4], %b: f32[B, 4]) {
      %0 = mul(%a, %b) : f32[B, 4]
      %1 = add(%0, %a) : f32[B, 4]
      return %1, %0
    }""")
    rng = np.random.default_rng()
    a, b = rng.standard_normal((2, 2, 4)).astype(np.float32)
    y1, y0 = fc.interpret(m, {"a": a, "b": b})
    assert relative_error(y1, a * b + a) <= 1e-6 and relative_error(y0, a * b) <= 1e-6


@pytest.mark.parametrize("inputs,match", [
    ({"x": np.ones((2, 6))}, r"missing inputs \['w'\]"),
    ({"x": np.ones((2, 6)), "w": np.ones(6), "y": 1}, r"unknown inputs \['y'\]"),
    ({"x": np.ones((2, 5)), "w": np.ones(6)}, r"'x' has shape \(2, 5\).*x: bf16\[B, 6\]"),
    ({"x": np.ones((2, 6)), "w": np.ones((1, 6))}, r"'w' has shape"),
    ({"x": np.ones((2, 6), np.int32), "w": np.ones(6)}, "has dtype int32"),
])
def test_bad_inputs(inputs, match):
    with pytest.raises(InputError, match=match):
        fc.interpret(two_out, inputs)


def test_symbol_bound_inconsistently():
    @fc.graph
    def g(x: fc.f32["B", 2], y: fc.f32["B", 2]):
        return x + y

    with pytest.raises(InputError, match="gives B = 3, but an earlier input gives B = 2"):
        fc.interpret(g, {"x": np.ones((2, 2)), "y": np.ones((3, 2))})
    with pytest.raises(InputError, match="rank 1 has sizes"):
        fc.interpret(g, [{"x": np.ones((2, 2)), "y": np.ones((2, 2))},
                         {"x": np.ones((3, 2)), "y": np.ones((3, 2))}])


def test_graph_selection():
    m = fc.module(two_out, fc.trace(lambda x: fc.silu(x), inputs={"x": fc.f32[2]}, name="s"))
    with pytest.raises(InputError, match="graph= one of two_out, s"):
        fc.interpret(m, {"x": np.ones(2)})
    (y,) = fc.interpret(m, {"x": np.zeros(2)}, graph="s")
    assert np.all(y == 0)
    (y,) = fc.interpret(m["s"], {"x": np.zeros(2)})
    assert np.all(y == 0)
    outs = fc.interpret(m["s"], {"x": np.zeros(2)}, ranks=3)
    assert len(outs) == 3
