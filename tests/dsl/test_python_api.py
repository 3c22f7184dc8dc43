"""The Python API: a traced Module interprets when called, the package's exports are visible
to static tools, compiled and jit graphs have a short repr."""
from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import fusionc as fc
from fusionc import f16
from fusionc.errors import InputError


@fc.graph
def block(x: f16["B", 64], norm: f16[64], w: f16[64, 64]):
    h = fc.rms_norm(x, norm, 1e-5, name="h")
    return x + fc.linear(h, w), h


def _inputs(rng):
    return (rng.standard_normal((2, 64)).astype(np.float32), rng.standard_normal(64),
            rng.standard_normal((64, 64)) / 8)


def test_called_module_interprets():
    x, norm, w = _inputs(np.random.default_rng(0))
    want = fc.interpret(block, {"x": x, "norm": norm, "w": w})
    for got in (block(x, norm, w), block(x, norm=norm, w=w), block(w=w, x=x, norm=norm)):
        assert isinstance(got, tuple) and len(got) == 2
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    assert isinstance(block, fc.ir.Module) and block.names == ("block",)


def test_one_output_returns_the_array():
    one = fc.graph(lambda x: x + x, name="twice", x=fc.Tensor("f16", "B", 8))
    y = one(np.ones((3, 8), np.float32))
    assert isinstance(y, np.ndarray) and y.dtype == np.float16 and (y == 2).all()


def test_call_errors():
    x, norm, w = _inputs(np.random.default_rng(1))
    with pytest.raises(InputError, match="takes 3 inputs, 4 given"):
        block(x, norm, w, w)
    with pytest.raises(InputError, match="positionally and by name"):
        block(x, norm, w, x=x)
    with pytest.raises(InputError, match="missing inputs"):
        block(x)
    with pytest.raises(InputError, match="module of 2 graphs"):
        fc.module(block, fc.graph(lambda x: x + x, name="t", x=fc.Tensor("f16", 4)))(x)


def test_exports_are_visible_to_type_checkers():
    """Every lazy export is imported under ``if TYPE_CHECKING:`` and listed in __all__."""
    tree = ast.parse(pathlib.Path(fc.__file__).read_text())
    checked = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.If)
               and getattr(node.test, "id", None) == "TYPE_CHECKING"
               for imp in node.body if isinstance(imp, ast.ImportFrom) for a in imp.names}
    lazy = set(fc._DSL_NAMES) | set(fc._SUBPACKAGES) | {"interpret", "compile", "jit",
                                                         "simulate"}
    assert lazy <= checked, lazy - checked
    assert {"f16", "graph", "linear", "compile", "interpret"} <= set(fc.__all__)
    assert all(getattr(fc, n) is not None for n in fc.__all__)


def test_compiled_and_jit_repr():
    from fusionc.dsl.loader import load_file
    m = load_file(pathlib.Path(__file__).parents[2] / "examples" / "llama2_7b.py", hidden=256,
                  heads=2, intermediate=512, max_seq=64)
    c = fc.compile(m, "mlp", max_batch=4)
    assert repr(c) == ("<CompiledGraph @mlp(x, mlp_norm, w_gate_up, w_down), max_batch=4: "
                       "kernels mlp_k1>")
    j = fc.jit(max_batch=4, name="twice", x=fc.Tensor("f16", "B", 8))(lambda x: x + x)
    assert repr(j) == "<JitGraph @twice(x), max_batch=4: not compiled yet>"
