"""Tracing: graph structure, names, types, source locations, operators, round trip."""
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fusionc as fc
from fusionc import f16, i32
from fusionc.errors import DSLError
from fusionc.ir import Graph, Module, parse_module, print_module


def _next_line() -> int:
    """The line after the caller's line (for checking recorded locations)."""
    return sys._getframe(1).f_lineno + 1


def test_annotations_and_decorator_inputs_give_the_same_module():
    @fc.graph
    def g(x: f16["B", 8], w: f16[8]):
        return fc.rms_norm(x, w, 1e-5)

    @fc.graph(x=fc.Tensor("f16", "B", 8), w=fc.Tensor(fc.f16, 8))
    def g2(x, w):
        return fc.rms_norm(x, w, 1e-5)

    assert isinstance(g, Module) and g.names == ("g",)
    assert g.graphs[0].replace(name="g2") == g2.graphs[0]


def test_structure_names_and_types():
    @fc.graph(name="blk")
    def f(x: f16["B", 16], w: f16[48, 16], pos: i32["B"]):
        q, k, v = fc.split(fc.linear(x, w, name="qkv"), [16, 16, 16], name=("q", "k", "v"))
        q = fc.rope(fc.split_heads(q, 2), pos, 10000.0, rotary_dim=4)
        return fc.merge_heads(q), k * v, q

    g = f["blk"]
    assert [p.name for p in g.params] == ["x", "w", "pos"]
    assert [op.name for op in g.body] == ["linear", "split", "reshape", "rope", "reshape", "mul"]
    assert [r.name for r in g.body[1].results] == ["q", "k", "v"]
    assert [r.name for r in g.body[2].results] == ["0"]
    assert str(g.body[3].results[0].type) == "f16[B, 2, 8]"
    assert g.body[3].attr_dict == {"theta": 10000.0, "style": "neox", "rotary_dim": 4,
                                   "scaling": ()}
    assert [str(o.type) for o in g.outputs] == ["f16[B, 16]", "f16[B, 16]", "f16[B, 2, 8]"]


def test_names_are_unique_and_derived():
    @fc.graph
    def f(x: f16["B", 4], w: f16[4], kc: f16["B", 8, 1, 4], vc: f16["B", 8, 1, 4],
          pos: i32["B"]):
        a = fc.rms_norm(x, w, 1e-5, name="h")
        b = fc.rms_norm(a, w, 1e-5, name="h")
        c = fc.add(a, b, name="0")
        d = a + c                                   # auto name skips the taken "0"
        k = fc.reshape(d, "B", 1, 4)
        kc2, vc2 = fc.kv_cache_append(kc, vc, k, k, pos)
        return d, kc2, vc2

    names = [r.name for op in f.graphs[0].body for r in op.results]
    assert names == ["h", "h.1", "0", "1", "2", "kc.1", "vc.1"]


def test_every_op_records_the_user_line():
    lines = []

    @fc.graph
    def f(x: f16["B", 4], w: f16[4]):
        lines.append(_next_line())
        h = fc.rms_norm(x, w, 1e-5)
        lines.append(_next_line())
        y = h + x
        lines.append(_next_line())
        return y * fc.silu(y)

    ops = f.graphs[0].body
    assert [(op.loc.file, op.loc.line) for op in ops] == [
        (__file__, lines[0]), (__file__, lines[1]), (__file__, lines[2]), (__file__, lines[2])]
    assert f.graphs[0].loc.file == __file__


def test_operators_and_methods():
    @fc.graph
    def f(a: f16["B", 4], b: f16["B", 4]):
        return (a + b) * a, a.reshape("B", 2, 2), a.cast("f32")

    g = f.graphs[0]
    assert [op.name for op in g.body] == ["add", "mul", "reshape", "cast"]
    assert str(g.outputs[2].type) == "f32[B, 4]"


def test_non_tensor_defaults_are_passed():
    @fc.graph
    def f(x: f16["B", 4], w: f16[4], eps: float = 1e-3, *, pos: i32["B"], style="gptj"):
        return fc.rope(fc.reshape(fc.rms_norm(x, w, eps), "B", 1, 4), pos, 1e4, style)

    assert [p.name for p in f.graphs[0].params] == ["x", "w", "pos"]
    assert f.graphs[0].body[0].attr("eps") == 1e-3
    assert f.graphs[0].body[2].attr("style") == "gptj"


def test_string_annotations_are_evaluated():
    def f(x: "f16['B', 8]", w: "fc.f16[8]"):
        return fc.rms_norm(x, w, 1e-5)

    g = fc.trace(f)
    assert str(g.graphs[0].params[0].type) == "f16[B, 8]"


def test_module_joins_graphs_and_round_trips():
    @fc.graph
    def a(x: f16["B", 4]):
        return fc.silu(x)

    @fc.graph
    def b(x: fc.bf16["B", 4], y: fc.bf16["B", 4]):
        return fc.silu_mul(x, y)

    m = fc.module(a, b.graphs[0])
    assert m.names == ("a", "b")
    assert parse_module(print_module(m)) == m
    with pytest.raises(DSLError, match="defined twice"):
        fc.module(a, a)


_NAME = st.text("abcxyzAB_.0123456789", min_size=1, max_size=6)
_STEP = st.tuples(st.sampled_from(["add", "mul", "silu", "silu_mul", "rms"]),
                  st.one_of(st.none(), _NAME))


@given(st.lists(_STEP, min_size=1, max_size=8), st.sampled_from(["f16", "bf16", "f32"]))
def test_random_traces_round_trip(steps, dtype):
    T = fc.dtype(dtype)

    def f(x: T["B", 8], y: T["B", 8], w: T[8]):
        vals = [x, y]
        for kind, name in steps:
            a, b = vals[-1], vals[-2]
            if kind == "rms":
                vals.append(fc.rms_norm(a, w, 1e-6, name=name))
            elif kind in ("silu",):
                vals.append(fc.silu(a, name=name))
            else:
                vals.append(getattr(fc, kind)(a, b, name=name))
        return vals[-1], vals[-2]

    m = fc.trace(f)
    g: Graph = m.graphs[0]
    names = [p.name for p in g.params] + [r.name for op in g.body for r in op.results]
    assert len(set(names)) == len(names)
    assert parse_module(print_module(m)) == m
