"""Fuzzing the parser: any text gives a module or a fusionc error, never another exception and
never a hang (docs/ARCHITECTURE.md, IR rules: no Python traceback from inside the compiler for user mistakes)."""
from __future__ import annotations

import re
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fusionc.errors import FusionError
from fusionc.ir import all_ops, lookup, parse_module, print_module
from fusionc.ir.registry import func_kind

from .strategies import modules

TIME_LIMIT_S = 2.0

# Tokens of the IR text, whitespace runs included, so mutations can work token by token.
_TOKEN = re.compile(r'%[A-Za-z0-9_.]+|@[A-Za-z0-9_.]+|[A-Za-z_][A-Za-z0-9_.]*'
                    r'|[+-]?[0-9.][0-9.eE+-]*|"(?:[^"\\\n]|\\.)*"|\s+|.', re.S)

VOCAB = ("(", ")", "{", "}", "[", "]", ",", ":", "=", "-", "+", ".", "%", "@", "//", "\"",
         "%x", "%0", "%y.1", "@g", "@k", "graph", "kernel", "return", "f16", "bf16", "f32",
         "i32", "f17", "B", "0", "1", "-1", "128", "4096", "1e-05", "-0.0", "1e999", "5e-324",
         "inf", "-inf", "nan", "true", "false", "neox", '"s"', '"\\q"', '"\t"', '"\\ud800"',
         "\x00", "\ud800", "\r\n", "\r", "\n", "\t", "é", "٣", "9" * 10000, "1." + "0" * 5000,
         "[" * 60, "]" * 60, "{" * 30, "add", "mul", "rms_norm", "rms_nrm", "linear", "split",
         "reshape", "rope", "cast", "decode_attention", "kv_cache_append", "all_reduce",
         "eps", "axis", "sizes", "shape", "dtype", "theta", "style", "rotary_dim", "scale",
         "group", "launch", "kernel", "when", "grid", "cluster", "threads")


def check_parse(text: str, verify: bool = True) -> None:
    """Parse ``text``: a module or a FusionError with a usable location, within the time limit.
    Any other exception escapes and fails the test. A module that parses also round trips."""
    t0 = time.perf_counter()
    try:
        m = parse_module(text, verify=verify)
    except FusionError as e:
        m = None
        assert str(e)  # renders
        assert e.loc is not None and e.loc.col is not None, f"no line:column in {e}"
        assert 1 <= e.loc.line <= text.count("\n") + 1, e
        # the verifier turns a crash inside an infer rule into this generic message; an infer
        # rule should say itself what is wrong
        assert "do not fit the op" not in e.message, f"infer rule crashed: {e}"
    elapsed = time.perf_counter() - t0
    assert elapsed < TIME_LIMIT_S, f"parse took {elapsed:.2f} s"
    if m is not None and verify:
        assert parse_module(print_module(m)) == m


PATHOLOGICAL = [
    "[" * 5000,
    "graph @g() { %x = add() {a = " + "[" * 5000 + "} return }",
    "graph @g() { %x = add() {a = " + "[" * 5000 + "]" * 5000 + "} : f16[1] return }",
    "graph @g(%x: f16[1]) { %y = reshape(%x) {shape = " + "[" * 5000 + "1" + "]" * 5000
    + "} : f16[1]\n return %y }",
    "graph @g(%x: f16[" + "9" * 10000 + "]) { return }",
    "graph @g(%x: f16[1], %w: f16[1]) { %y = rms_norm(%x, %w) {eps = " + "9" * 10000
    + "} : f16[1] return %y }",
    "graph @g(%x: f16[1], %w: f16[1]) { %y = rms_norm(%x, %w) {eps = " + "9" * 400
    + "} : f16[1] return %y }",
    "graph @g(%x: f16[1], %w: f16[1]) { %y = rms_norm(%x, %w) {eps = 1" + "0" * 10000
    + ".0} : f16[1] return %y }",
    "graph @g(%x: f16[1]) { %y = split(%x) {axis = " + "9" * 10000 + ", sizes = [1]}"
    " : f16[1] return %y }",
    "graph @g(%x: f16[1]) { %y = split(%x) {axis = " + "9" * 4000 + ", sizes = [1]}"
    " : f16[1] return %y }",
    "graph @g(%x: f16[1]) { %y = all_reduce(%x) {group = " + "9" * 4000 + "} : f16[1]"
    " return %y }",
    "graph @g() {\x00 return }", "\x00" * 100, "graph @g\x00() { return }",
    "graph @g() { return } \ud800", "graph @\ud800() { return }", '"\ud800"',
    "graph @g() {\r\n  return\r\n}\r\n", "graph @g() {\r  return\r}\r",
    "graph @g(%x: f16[B, 8], %w: f16[8]) {\r\n  %y = rms_norm(%x, %w) {eps = 1e-05} : "
    "f16[B, 8]\r\n  return %y\r\n}\r\n",
    "graph @g(%x: f16[B, 8], %w: f16[8]) {\n  %y = rms_norm(%x, %w) {eps = \"\\ud800\"}"
    " : f16[B, 8]\n  return %y\n}\n",
    "graph @g() { %x = when() (" + "{ %y = when() (" * 3000 + ") return }",
    "graph @" + "a" * 100000 + "() { return }",
    "graph @g() { %x = " + "a" * 100000 + "() return }",
    "graph @g() {" + " %x = add(%x, %x) : f16[1]" * 2000 + " return }",
    "graph @g(" + ", ".join(f"%x{i}: f16[1]" for i in range(3000)) + ") { return }",
    "graph @g(%x: f16[" + ", ".join("B" for _ in range(3000)) + "]) { return %x }",
    "graph @g() { return }" * 1000,
    "kernel @k {grid = 1, cluster = 1} () { return }",
    "kernel @k {grid = " + "[" * 3000 + "} () { return }",
    "// only a comment",
    "graph @g() { return } // trailing comment without newline",
]


@pytest.mark.parametrize("text", PATHOLOGICAL, ids=range(len(PATHOLOGICAL)))
def test_pathological_inputs(text):
    check_parse(text)
    check_parse(text, verify=False)


@settings(max_examples=200)
@given(st.text())
@example("")
@example("graph")
@example("graph @g(")
def test_random_text(text):
    check_parse(text)


@settings(max_examples=150)
@given(st.binary())
def test_random_bytes(data):
    check_parse(data.decode("utf-8", errors="replace"))
    check_parse(data.decode("latin-1"))


_ALPHABET = st.sampled_from("()[]{}%@,:=-+.\"\\ \n\r\t\x00eE09_aBfgkrx") | st.characters()


@st.composite
def mutated_ir(draw) -> str:
    """The text of a random well-typed module with a few random edits to characters, tokens or
    lines."""
    text = print_module(draw(modules(max_graphs=2)))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3, 6]))):
        how = draw(st.sampled_from(["del_char", "ins_char", "rep_char", "dup_char", "del_tok",
                                    "ins_tok", "rep_tok", "dup_tok", "swap_tok", "swap_lines",
                                    "dup_line", "del_line"]))
        unit, op = how.split("_")[1], how.split("_")[0]
        if unit == "char":
            parts = list(text)
        elif unit == "tok":
            parts = _TOKEN.findall(text)
        else:
            parts = text.splitlines(keepends=True)
        if not parts:
            parts = [""]
        i = draw(st.integers(0, len(parts) - 1))
        if unit == "char":
            new = draw(_ALPHABET)
        elif unit == "tok":  # often a token of the text itself: more edits stay grammatical
            own = [p for p in parts if p.strip()] or ["x"]
            new = draw(st.sampled_from(own) | st.sampled_from(VOCAB) | st.text(max_size=5))
        else:
            new = ""
        if op == "del":
            del parts[i]
        elif op == "ins":
            parts.insert(i, new)
        elif op == "rep":
            parts[i] = new
        elif op == "dup":
            parts.insert(i, parts[i])
        else:  # swap
            j = draw(st.integers(0, len(parts) - 1))
            parts[i], parts[j] = parts[j], parts[i]
        text = "".join(parts)
    return text


@pytest.mark.slow
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_ir())
def test_mutated_ir(text):
    check_parse(text)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_ir())
def test_mutated_ir_without_verifier(text):
    check_parse(text, verify=False)


# ----------------------------------------------------------------------------------------------
# grammatical but ill-typed text: every registered op with random operands, attributes and
# result types, so each infer rule meets junk and must answer with a VerifyError


_dims = st.one_of(st.integers(1, 8), st.integers(1, 8),
                  st.sampled_from(["B", "B", "S", "graph"]), st.sampled_from([0, -1, 4096, 2**70]))
_type_text = st.builds(lambda dt, dims: f"{dt}[{', '.join(map(str, dims))}]",
                       st.sampled_from(["f16", "bf16", "f32", "f64", "i32", "i64"]),
                       st.lists(_dims, max_size=4))
_scalar_text = st.one_of(
    st.integers(-3, 10).map(str), st.sampled_from(["0", "-1", "9" * 30, "1e-05", "-0.0",
                                                   "0.5", "inf", "-inf", "nan", "1e999"]),
    st.sampled_from(["true", "false", "sum", "max", "neox", "gptj", "f16", "i32", "B", "rank",
                     "cluster", "@g", "@k", '""', '"x"', '"B"', '"rank + 1"', '"cluster*4"',
                     '"128*cluster + 32*rank + 4"', '"1/0"', '"(("', '"rank*rank"']))
_attr_value_text = st.recursive(_scalar_text, lambda inner: st.lists(inner, max_size=4).map(
    lambda xs: "[" + ", ".join(xs) + "]"), max_leaves=6)


_ints_text = st.lists(st.integers(-2, 70), max_size=4).map(
    lambda xs: f"[{', '.join(map(str, xs))}]")
_affine_text = st.sampled_from(['"0"', '"rank"', '"cluster"', '"32*rank"', '"rank + 1"',
                                '"128*cluster + 32*rank + 4"', '"-rank"', '"B"', '"2*2*rank"'])


def _kind_text(kind) -> st.SearchStrategy[str]:
    """Attribute text that usually has the right kind (with odd values), else anything."""
    by_kind = {
        "int": st.integers(1, 64).map(str) | st.integers(1, 8).map(str)
        | st.sampled_from(["9" * 25, "0", "-1"]),
        "float": _scalar_text.filter(lambda t: t[0] in "0123456789-i"),
        "bool": st.sampled_from(["true", "false"]),
        "enum": st.sampled_from(kind.choices or ("x",)),
        "ints": _ints_text,
        "dims": st.lists(_dims, max_size=4).map(lambda xs: f"[{', '.join(map(str, xs))}]"),
        "floats": st.lists(st.sampled_from(["0.5", "1", "-inf", "1e-05"]), max_size=3).map(
            lambda xs: f"[{', '.join(xs)}]"),
        "symbol": st.sampled_from(["@f", "@g", "@k"]),
        "affine": _affine_text,
        "affines": st.lists(_affine_text, max_size=3).map(lambda xs: f"[{', '.join(xs)}]"),
    }
    typed = by_kind.get(kind.name, _attr_value_text)
    return st.one_of(typed, typed, typed, _attr_value_text)


@st.composite
def ill_typed_op_text(draw, name: str) -> str:
    """A one-op item using op ``name`` with random operand types, attributes, result types."""
    d = lookup(name)
    kind = draw(st.sampled_from(sorted(d.where)))
    params = [draw(_type_text) for _ in range(draw(st.integers(1, 5)))]
    n_max = min(d.max_operands, d.min_operands + 2)
    n = draw(st.integers(d.min_operands, n_max) | st.integers(0, 5))
    operands = [f"%p{draw(st.integers(0, len(params) - 1))}" for _ in range(n)]
    attrs = {a.name: draw(_kind_text(a.kind)) for a in d.attrs
             if draw(st.integers(0, 7 if a.required else 1))}  # mostly complete: gets further
    if not draw(st.integers(0, 7)):
        attrs[draw(st.sampled_from(["bogus", "eps", "axis", "sizes"]))] = draw(_attr_value_text)
    results = [draw(_type_text) for _ in range(draw(st.integers(0, 3)))]
    head = f"{kind} @f"
    fk = func_kind(kind)
    if fk is not None and fk.attrs:
        head += " {" + ", ".join(  # usually valid, so that the op is checked
            f"{a.name} = {draw(_kind_text(a.kind)) if not draw(st.integers(0, 7)) else 1}"
            for a in fk.attrs if a.required) + "}"
    lhs = ", ".join(f"%r{i}" for i in range(len(results)))
    attr_text = " {" + ", ".join(f"{k} = {v}" for k, v in attrs.items()) + "}" if attrs else ""
    region = " (" + ", ".join(["{\n  }"] * d.regions) + ")" if d.regions else ""
    return (f"{head}({', '.join(f'%p{i}: {t}' for i, t in enumerate(params))}) {{\n"
            f"  {lhs + ' = ' if lhs else ''}{name}({', '.join(operands)}){attr_text}"
            f"{' : ' + ', '.join(results) if results else ''}{region}\n"
            f"  return\n}}\n")


@pytest.mark.parametrize("name", sorted(all_ops()))
def test_ill_typed_ops(name):
    """Every registered op (tile IR too): its infer and verify rules answer junk with a
    FusionError. One test per op, so a failure names the op."""
    @settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
    @given(ill_typed_op_text(name))
    def check(text):
        check_parse(text)
    check()
