"""Attributes of every kind round trip through text exactly, and are checked against the schema.

A test-only op with one attribute of each kind is registered for the duration of each example,
so the kinds are covered whether or not a built-in op uses them."""
from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusionc.errors import VerifyError
from fusionc.ir import Graph, Module, Op, SymbolRef, parse_module, print_module, registry
from fusionc.ir.registry import (BOOL, DIMS, FLOAT, FLOATS, INT, INTS, STR, SYMBOL, OpDef, attr,
                                 enum)

from .strategies import symbol_names

SCHEMA = (attr("i", INT), attr("f", FLOAT), attr("b", BOOL, False), attr("s", STR, ""),
          attr("e", enum("a", "b.c", "_x", "f16"), "a"), attr("ii", INTS, ()),
          attr("d", DIMS, ()), attr("sym", SYMBOL, SymbolRef("g")), attr("ff", FLOATS, ()))


@contextlib.contextmanager
def attrs_op():
    registry.all_ops()
    d = OpDef("test_attrs", "every attribute kind", (), SCHEMA, lambda op: ())
    registry._OPS["test_attrs"] = d
    try:
        yield d
    finally:
        del registry._OPS["test_attrs"]


floats = st.floats(allow_nan=True) | st.sampled_from([-0.0, 5e-324, -math.inf, 1e-05])
attr_values = st.fixed_dictionaries(
    {"i": st.integers(-2**200, 2**200), "f": floats.filter(lambda x: not math.isnan(x))},
    optional={
        "b": st.booleans(),
        "s": st.text() | st.sampled_from(["\ud800", "\x00", '"', "\\", "\n\r\t", "é €"]),
        "e": st.sampled_from(["a", "b.c", "_x", "f16"]),
        "ii": st.lists(st.integers(-2**70, 2**70), max_size=4),
        "d": st.lists(st.integers(1, 2**40) | symbol_names, max_size=4).map(tuple),
        "sym": symbol_names.map(SymbolRef),
        "ff": st.lists(floats.filter(lambda x: not math.isnan(x)), max_size=4)})


def _module(attrs) -> Module:
    return Module((Graph("g", (), (Op("test_attrs", (), (), attrs),), ()),))


@pytest.mark.slow
@settings(max_examples=200)
@given(attr_values)
def test_every_attribute_kind_round_trips(given_attrs):
    with attrs_op() as d:
        attrs = d.make_attrs(given_attrs)
        m = _module(attrs)
        text = print_module(m)
        m2 = parse_module(text)
        assert m2 == m, text
        assert print_module(m2) == text
        got = dict(m2.graphs[0].body[0].attrs)
        assert repr(got["f"]) == repr(float(given_attrs["f"]))  # -0.0, 5e-324 exactly
        assert got["i"] == given_attrs["i"] and type(got["i"]) is int


@pytest.mark.parametrize("key, value, message", [
    ("i", 1.5, "attribute 'i': expected an integer, got 1.5"),
    ("i", True, "attribute 'i': expected an integer, got true"),
    ("f", float("nan"), "attribute 'f': expected a number, got nan"),
    ("f", "1.0", "attribute 'f': expected a number, got \"1.0\""),
    ("f", 10**400, "out of the range of a double"),
    ("b", 1, "attribute 'b': expected true or false, got 1"),
    ("e", "b", "attribute 'e': expected one of a, b.c, _x, f16, got \"b\""),
    ("ii", [1, "B"], "attribute 'ii': expected an integer, got \"B\""),
    ("d", ["1B"], "attribute 'd': expected an integer, got \"1B\""),
    ("d", ["é"], "attribute 'd': expected an integer, got"),
    ("sym", "g", "attribute 'sym': expected a reference @name, got \"g\""),
    ("ff", [1.0, float("nan")], "attribute 'ff': expected a number, got nan"),
    ("zz", 1, "unknown attribute 'zz'"),
])
def test_bad_attribute_values(key, value, message):
    with attrs_op() as d:
        with pytest.raises(VerifyError) as e:
            d.make_attrs({"i": 1, "f": 1.0, key: value})
        assert message in str(e.value) and e.value.op == "test_attrs"


@pytest.mark.parametrize("text, message", [
    ("{i = 1}", "missing attribute 'f'"),
    ("{i = 1, f = 1.0, s = x}", "attribute 's': expected a quoted string, got x"),
    ("{i = 1, f = 1.0, e = \"b.c\"}", None),  # a quoted enum value is accepted
    ("{i = 1, f = -inf, ff = [-inf, inf, -0.0, 1]}", None),
    ("{i = 1, f = 1.0, b = True}", "expected true or false, got True"),
    ("{i = 1, f = 1.0, sym = @}", "unexpected '@'"),
    ("{i = 1, f = 1.0, s = \"\\x41\"}", "bad string literal"),
    ("{i = 1, f = 1.0, s = \"\t\"}", "bad string literal"),
    ("{i = 1, f = 1.0, d = [B, -inf]}", "expected an integer, got -inf"),
])
def test_attribute_text(text, message):
    src = f"graph @g() {{\n  test_attrs() {text}\n  return\n}}\n"
    with attrs_op():
        if message is None:
            m = parse_module(src)
            assert parse_module(print_module(m)) == m
        else:
            with pytest.raises(Exception) as e:
                parse_module(src)
            assert message in str(e.value) and e.value.loc.line == 2, str(e.value)
