"""print_module / parse_module round trip on random well-typed modules (docs/ARCHITECTURE.md, IR rules)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings

from fusionc.ir import Module, lookup, parse_module, print_module, verify_module
from fusionc.ir.types import DType

from .strategies import OP_BUILDERS, SPECIAL_FLOATS, graphs, modules

# The graph-IR ops of issue 2; each must have a builder in strategies.py.
GRAPH_IR_OPS = {"rms_norm", "linear", "add", "mul", "silu", "silu_mul", "cast", "reshape",
                "split", "rope", "kv_cache_append", "decode_attention", "all_reduce"}


def assert_round_trip(m: Module) -> str:
    text = print_module(m)
    m2 = parse_module(text)
    assert m2 == m, f"round trip changed the module:\n{text}\n---\n{print_module(m2)}"
    assert print_module(m2) == text  # also catches -0.0 == 0.0 and 1 == 1.0 slipping through
    return text


@pytest.mark.slow
@settings(max_examples=200)
@given(modules())
def test_random_modules_verify_and_round_trip(m):
    verify_module(m)
    assert_round_trip(m)


@settings(max_examples=60)
@given(graphs(max_ops=20, symbols=("B",)))
def test_long_graphs_round_trip(g):
    assert_round_trip(Module((g,)))


@pytest.mark.parametrize("op", sorted(GRAPH_IR_OPS))
def test_every_graph_op_round_trips(op):
    @settings(max_examples=15)
    @given(graphs(ops=[op], max_ops=3))
    def check(g):
        assert_round_trip(Module((g,)))
    check()


def test_strategies_cover_every_graph_op():
    assert GRAPH_IR_OPS <= set(OP_BUILDERS), GRAPH_IR_OPS - set(OP_BUILDERS)
    for name in OP_BUILDERS:
        assert lookup(name) is not None, f"builder for unregistered op {name}"


def _norm_module(eps_text: str) -> str:
    return (f"graph @g(%x: f32[B, 4], %w: f32[4]) {{\n"
            f"  %y = rms_norm(%x, %w) {{eps = {eps_text}}} : f32[B, 4]\n"
            f"  return %y\n}}\n")


@pytest.mark.parametrize("eps", tuple(x for x in SPECIAL_FLOATS if math.isfinite(x))
                         + (2.0**-1074, 1e16, 1e22, 0.30000000000000004))
def test_float_attributes_round_trip_exactly(eps):
    m = parse_module(_norm_module(repr(eps)))
    text = assert_round_trip(m)
    got = parse_module(text).graphs[0].body[0].attr("eps")
    assert math.copysign(1, got) == math.copysign(1, eps) and (got == eps)
    assert got.hex() == float(eps).hex()


@pytest.mark.parametrize("written, printed", [
    ("1e-05", "1e-05"), ("0.00001", "1e-05"), ("-0.0", "-0.0"), ("5e-324", "5e-324"),
    ("1.7976931348623157e308", "1.7976931348623157e+308"), ("1", "1.0"), ("+2.5", "2.5"),
    (".5", "0.5"), ("1.", "1.0"), ("1E3", "1000.0")])
def test_float_spellings_normalize(written, printed):
    text = print_module(parse_module(_norm_module(written)))
    assert f"{{eps = {printed}}}" in text


@pytest.mark.parametrize("written", ["inf", "1e999"])
def test_infinite_eps_parses_but_is_rejected(written):
    from fusionc.errors import VerifyError
    from fusionc.ir.registry import FLOAT
    assert FLOAT.format(FLOAT.convert(float(written))) == "inf"  # the text form has inf
    with pytest.raises(VerifyError, match="a finite eps"):
        parse_module(_norm_module(written))


def test_negative_inf_and_ints_in_float_lists_format():
    from fusionc.ir.registry import FLOAT, FLOATS
    assert FLOAT.format(-math.inf) == "-inf"
    assert FLOATS.format(FLOATS.convert([1, -0.0, 2.5])) == "[1.0, -0.0, 2.5]"


def test_all_dtypes_round_trip():
    params = ", ".join(f"%{d.value}: {d.value}[B, 3]" for d in DType)
    m = parse_module(f"graph @g({params}) {{\n  return\n}}\n")
    assert [p.type.dtype for p in m.graphs[0].params] == list(DType)
    assert_round_trip(m)


def test_keywords_work_as_names():
    """graph, kernel, return, dtypes and literals are fine as value, graph and dim names."""
    src = """graph @graph(%graph: f16[return, 8], %return: f16[8], %kernel: i32[return]) {
  %inf = rms_norm(%graph, %return) {eps = 1e-05} : f16[return, 8]
  %f16 = reshape(%inf) {shape = [return, 2, 4]} : f16[return, 2, 4]
  %true = rope(%f16, %kernel) {theta = 10000.0, style = gptj, rotary_dim = 4} : f16[return, 2, 4]
  return %true
}

graph @return() {
  return
}
"""
    assert assert_round_trip(parse_module(src)) == src


def test_comments_crlf_and_blank_lines_are_ignored():
    src = _norm_module("1e-05")
    noisy = "// header\r\n\r\n" + src.replace("\n", "  // note\r\n")
    assert parse_module(noisy) == parse_module(src)


def test_empty_module():
    assert parse_module("") == Module(())
    assert parse_module(print_module(Module(()))) == Module(())


def test_other_item_kinds_plug_in():
    """A kind registered in ITEM_KINDS (here the tile IR's kernel, without its ops) is built
    by the same strategies."""
    from hypothesis import strategies as st

    from fusionc.ir.registry import func_kind

    from .strategies import ITEM_KINDS, ItemKind
    if func_kind("kernel") is None:
        pytest.skip("no kernel item kind registered")
    added = "kernel" not in ITEM_KINDS
    if added:
        ITEM_KINDS["kernel"] = ItemKind(
            attrs=st.fixed_dictionaries({"grid": st.integers(1, 64),
                                         "cluster": st.sampled_from([1, 2, 4, 8])}),
            outputs=lambda c: c.params[:1])
    try:
        @settings(max_examples=20)
        @given(modules(kinds=("graph", "kernel"), ops=[]))
        def check(m):
            verify_module(m)
            assert_round_trip(m)
        check()
    finally:
        if added:
            del ITEM_KINDS["kernel"]
