"""Ops with regions: printing, parsing and scopes (values defined outside a region are visible
inside; values defined inside are not visible after it; one definition per name per graph).

Uses a test-only op registered for the duration of each test, so nothing depends on the tile
IR's ops."""
from __future__ import annotations

import pytest

from fusionc.errors import VerifyError
from fusionc.ir import Graph, Module, Op, Value, parse_module, print_module, tensor, verify_module
from fusionc.ir import registry
from fusionc.ir.registry import INT, OpDef, attr


@pytest.fixture(autouse=True)
def region_ops(monkeypatch):
    registry.all_ops()  # load the built-in ops first
    monkeypatch.setitem(registry._OPS, "test_branch", OpDef(
        "test_branch", "two regions, no results", ("x?",), (attr("k", INT, 0),),
        lambda op: (), regions=2))
    monkeypatch.setitem(registry._OPS, "test_loop", OpDef(
        "test_loop", "one region, passes x through", ("x",), (), lambda op: (op.operands[0].type,),
        regions=1))


TEXT = """graph @g(%x: f16[B, 8]) {
  test_branch(%x) {k = 3} ({
    %a = silu(%x) : f16[B, 8]
    %b = test_loop(%a) : f16[B, 8] ({
      %c = add(%a, %x) : f16[B, 8]
    })
  }, {
  }, )
  %y = silu(%x) : f16[B, 8]
  return %y
}
"""


def test_regions_round_trip():
    text = TEXT.replace("  }, )\n", "  })\n")
    m = parse_module(text)
    assert print_module(m) == text
    op = m["g"].body[0]
    assert len(op.regions) == 2 and op.regions[1] == ()
    assert [o.name for o in m["g"].walk()] == ["test_branch", "silu", "test_loop", "add", "silu"]


def test_trailing_comma_in_regions_is_a_syntax_error():
    with pytest.raises(Exception) as e:
        parse_module(TEXT)
    assert type(e.value).__name__ == "ParseError"


def test_value_from_a_region_is_not_visible_after_it():
    text = TEXT.replace("  }, )\n", "  })\n").replace("%y = silu(%x)", "%y = silu(%a)")
    with pytest.raises(VerifyError, match="use of undefined value %a") as e:
        parse_module(text)
    assert (e.value.loc.line, e.value.loc.col) == (9, 13)


def test_name_defined_in_a_region_cannot_be_reused_outside():
    text = TEXT.replace("  }, )\n", "  })\n").replace("%y = silu(%x)", "%c = silu(%x)") \
        .replace("return %y", "return %c")
    with pytest.raises(VerifyError, match="value %c is defined twice") as e:
        parse_module(text)
    assert e.value.loc.line == 9


def test_sibling_regions_do_not_share_values():
    x = Value("x", tensor("f16", 4))
    a = Value("a", x.type)
    op = Op("test_branch", (), (x,), (("k", 0),),
            regions=((Op("silu", (a,), (x,)),), (Op("silu", (Value("b", x.type),), (a,)),)))
    with pytest.raises(VerifyError, match="use of undefined value %a"):
        verify_module(Module((Graph("g", (x,), (op,), ()),)))


def test_wrong_number_of_regions():
    x = Value("x", tensor("f16", 4))
    with pytest.raises(VerifyError, match="1 regions given, 2 expected"):
        verify_module(Module((Graph("g", (x,), (Op("test_branch", (), (x,), (("k", 0),),
                                                    regions=((),)),), ()),)))
    with pytest.raises(VerifyError, match="0 regions given, 1 expected"):
        parse_module("graph @g(%x: f16[4]) {\n  %y = test_loop(%x) : f16[4]\n  return\n}\n")


def _nested(n: int) -> str:
    body = "".join(f"{'  ' * (i + 1)}%v{i + 1} = test_loop(%v0) : f16[4] ({{\n" for i in range(n))
    close = "".join(f"{'  ' * (i + 1)}}})\n" for i in reversed(range(n)))
    return f"graph @g(%v0: f16[4]) {{\n{body}{close}  return %v1\n}}\n"


def test_nested_regions_round_trip():
    text = _nested(40)
    assert print_module(parse_module(text)) == text


@pytest.mark.parametrize("depth", [400, 3000])
def test_too_deep_nesting_is_a_parse_error(depth):
    from fusionc.errors import ParseError
    with pytest.raises(ParseError, match="nested too deeply"):
        parse_module(_nested(depth))


def test_item_attributes_must_be_canonical(monkeypatch):
    from fusionc.ir.registry import FUNC_KINDS, POS_INT, FuncKind
    monkeypatch.setitem(FUNC_KINDS, "test_kernel", FuncKind(
        "test_kernel", (attr("grid", POS_INT), attr("threads", POS_INT, 128))))
    text = "test_kernel @k {grid = 2} () {\n  return\n}\n"
    with pytest.raises(Exception, match="'graph' or 'kernel'"):  # the grammar names the kinds
        parse_module(text)
    g = Graph("k", (), (), (), "test_kernel", (("grid", 2), ("threads", 128)))
    verify_module(Module((g,)))
    for bad, why in [((("grid", 2),), "canonical"), ((("threads", 128), ("grid", 2)), "canonical"),
                     ((("grid", 2.0), ("threads", 128)), "expected an integer"),
                     ((("grid", 2), ("threads", 128), ("x", 1)), "unknown attribute 'x'")]:
        with pytest.raises(VerifyError, match=why):
            verify_module(Module((g.replace(attrs=bad),)))
