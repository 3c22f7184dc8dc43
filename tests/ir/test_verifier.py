"""The verifier (and the parser's checks) reject bad IR, each mistake with its own message that
names the op, the IR line:column and what would be valid (issue 2, docs/ARCHITECTURE.md "IR rules")."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fusionc.errors import FusionError, ParseError, VerifyError
from fusionc.ir import Graph, Module, Op, Value, parse_module, print_module, tensor, verify_module
from fusionc.ir.registry import lookup


END = object()


def loc_of(text: str, needle, nth: int = 0) -> tuple[int, int]:
    """1-based line and column of the ``nth`` occurrence of ``needle`` in ``text`` (or of the
    end of the text for ``END``)."""
    if needle is END:
        return text.count("\n") + 1, len(text) - text.rfind("\n")
    i = -1
    for _ in range(nth + 1):
        i = text.index(needle, i + 1)
    return text.count("\n", 0, i) + 1, i - (text.rfind("\n", 0, i) + 1) + 1


@dataclass
class Case:
    id: str
    text: str
    error: type  # ParseError or VerifyError
    message: str  # a distinctive substring of the message
    at: object  # where the error points: the first occurrence of this substring (END: the end)
    nth: int = 0  # ...or a later one
    op: str | None = None  # the op the error names
    valid: str | None = None  # a substring of what would be valid


def g(params: str, body: str, ret: str = "") -> str:
    return f"graph @g({params}) {{\n{body}\n  return {ret}\n}}\n"


CASES = [
    Case(
        "linear_shape_mismatch",
        g("%x: f16[B, 4096], %w: f16[11008, 2048]", "  %y = linear(%x, %w) : f16[B, 11008]", "%y"),
        VerifyError,
        "has 4096 input features but weight f16[11008, 2048] expects 2048",
        "linear",
        op="linear",
        valid="x of shape [..., 2048]",
    ),
    Case(
        "linear_bias_mismatch",
        g(
            "%x: f16[B, 64], %w: f16[128, 64], %b: f16[64]",
            "  %y = linear(%x, %w, %b) : f16[B, 128]",
            "%y",
        ),
        VerifyError,
        "bias f16[64] does not match weight rows 128",
        "linear",
        op="linear",
        valid="bias of shape [128]",
    ),
    Case(
        "q_projection_not_heads_times_head_dim",
        g(
            "%x: f16[B, 2048], %wq: f16[4096, 2048]",
            "  %q = linear(%x, %wq) : f16[B, 4096]\n"
            "  %qh = reshape(%q) {shape = [B, 32, 64]} : f16[B, 32, 64]",
            "%qh",
        ),
        VerifyError,
        "cannot reshape f16[B, 4096] to [B, 32, 64]: element counts differ",
        "reshape",
        op="reshape",
        valid="heads * head_dim equal to the features of x",
    ),
    Case(
        "kv_heads_do_not_divide_heads",
        g(
            "%q: f16[B, 32, 128], %kc: f16[B, 4096, 5, 128], %vc: f16[B, 4096, 5, 128], %n: i32[B]",
            "  %o = decode_attention(%q, %kc, %vc, %n) {scale = 0.08838834764831845}"
            " : f16[B, 32, 128]",
            "%o",
        ),
        VerifyError,
        "num_kv_heads = 5 does not divide num_heads = 32",
        "decode_attention",
        op="decode_attention",
        valid="multiple of num_kv_heads",
    ),
    Case(
        "mixed_dtypes_without_cast",
        g("%a: f16[B, 8], %b: f32[B, 8]", "  %c = add(%a, %b) : f16[B, 8]", "%c"),
        VerifyError,
        "operands have mixed dtypes f16[B, 8], f32[B, 8]",
        "add",
        op="add",
        valid="insert cast",
    ),
    Case(
        "unknown_attribute",
        g(
            "%x: f16[B, 8], %w: f16[8]",
            "  %y = rms_norm(%x, %w) {eps = 1e-05, epsilon = 1e-06} : f16[B, 8]",
            "%y",
        ),
        VerifyError,
        "unknown attribute 'epsilon'",
        "rms_norm",
        op="rms_norm",
        valid="eps",
    ),
    Case(
        "missing_attribute",
        g("%x: f16[B, 8], %w: f16[8]", "  %y = rms_norm(%x, %w) : f16[B, 8]", "%y"),
        VerifyError,
        "missing attribute 'eps'",
        "rms_norm",
        op="rms_norm",
        valid="eps = <a number>",
    ),
    Case(
        "attribute_of_wrong_kind",
        g("%x: f16[B, 8], %w: f16[8]", '  %y = rms_norm(%x, %w) {eps = "x"} : f16[B, 8]', "%y"),
        VerifyError,
        "attribute 'eps': expected a number, got \"x\"",
        "rms_norm",
        op="rms_norm",
    ),
    Case(
        "enum_attribute_out_of_range",
        g(
            "%x: f16[B, 2, 8], %p: i32[B]",
            "  %y = rope(%x, %p) {theta = 10000.0, style = llama, rotary_dim = 8} : f16[B, 2, 8]",
            "%y",
        ),
        VerifyError,
        "attribute 'style': expected one of neox, gptj, got llama",
        "rope",
        op="rope",
    ),
    Case(
        "use_of_undefined_value",
        g("%x: f16[B, 8]", "  %y = silu(%z) : f16[B, 8]", "%y"),
        VerifyError,
        "use of undefined value %z",
        "%z",
        valid="defined earlier",
    ),
    Case(
        "use_before_definition",
        g("%x: f16[B, 8]", "  %y = add(%x, %t) : f16[B, 8]\n  %t = silu(%x) : f16[B, 8]", "%y"),
        VerifyError,
        "use of undefined value %t",
        "%t",
    ),
    Case(
        "return_of_undefined_value",
        g("%x: f16[B, 8]", "  %y = silu(%x) : f16[B, 8]", "%q"),
        VerifyError,
        "use of undefined value %q",
        "%q",
    ),
    Case(
        "value_defined_twice",
        g("%x: f16[B, 8]", "  %y = silu(%x) : f16[B, 8]\n  %y = silu(%x) : f16[B, 8]", "%y"),
        VerifyError,
        "value %y is defined twice",
        "silu",
        nth=1,
        op="silu",
        valid="a fresh name",
    ),
    Case(
        "result_redefines_parameter",
        g("%x: f16[B, 8]", "  %x = silu(%x) : f16[B, 8]", "%x"),
        VerifyError,
        "value %x is defined twice",
        "silu",
        op="silu",
    ),
    Case(
        "parameter_defined_twice",
        g("%x: f16[B, 8], %x: f16[B, 8]", "", "%x"),
        VerifyError,
        "value %x is defined twice",
        "%x",
        nth=1,   # the second parameter's name
    ),
    Case(
        "graph_defined_twice",
        g("", "") + "\n" + g("", ""),
        VerifyError,
        "@g is defined twice",
        "graph",
        nth=1,
        valid="unique graph",
    ),
    Case(
        "unknown_op",
        g("%x: f16[B, 8], %w: f16[8]", "  %y = rms_nrm(%x, %w) {eps = 1e-05} : f16[B, 8]", "%y"),
        ParseError,
        "unknown op 'rms_nrm'",
        "rms_nrm",
        valid="did you mean rms_norm",
    ),
    Case(
        "unknown_dtype",
        g("%x: f17[B, 8]", "  %y = silu(%x) : f17[B, 8]", "%y"),
        ParseError,
        "unknown dtype 'f17'",
        "f17",
        valid="f16, bf16, f32",
    ),
    Case(
        "syntax_error_says_what_was_expected",
        g("%x: f16[B, 8]", "  %y = silu(%x : f16[B, 8]", "%y"),
        ParseError,
        "unexpected ':'",
        ":",
        nth=1,
        valid="expected ')', ','",
    ),
    Case(
        "syntax_error_at_end_of_input",
        "graph @g(%x: f16[B, 8]) {\n  return %x\n  ",
        ParseError,
        "unexpected end of input",
        END,
        valid="'}'",
    ),
    Case(
        "unexpected_character",
        g("%x: f16[B, 8]", "  %y = silu(%x) ; f16[B, 8]", "%y"),
        ParseError,
        "unexpected ';'",
        ";",
    ),
    Case(
        "wrong_number_of_operands",
        g("%x: f16[B, 8]", "  %y = add(%x) : f16[B, 8]", "%y"),
        VerifyError,
        "1 operand given, 2 expected",
        "add",
        op="add",
        valid="add(%a, %b)",
    ),
    Case(
        "too_many_operands",
        g("%x: f16[B, 8], %w: f16[8, 8]", "  %y = linear(%x, %w, %x, %x) : f16[B, 8]", "%y"),
        VerifyError,
        "4 operands given, 2 to 3 expected",
        "linear",
        op="linear",
        valid="linear(%x, %w, %bias?)",
    ),
    Case(
        "result_type_disagrees_with_inference",
        g("%x: f16[B, 8], %w: f16[8]", "  %y = rms_norm(%x, %w) {eps = 1e-05} : f16[B, 9]", "%y"),
        VerifyError,
        "result types (f16[B, 9]) do not match the inferred (f16[B, 8])",
        "rms_norm",
        op="rms_norm",
        valid="(f16[B, 8])",
    ),
    Case(
        "result_count_disagrees_with_types",
        g("%x: f16[B, 8]", "  %y, %z = silu(%x) : f16[B, 8]", "%y"),
        ParseError,
        "2 results but 1 types",
        "silu",
        op="silu",
    ),
    Case(
        "bad_dimension_of_parameter",
        g("%x: f16[B, 0]", "", "%x"),
        VerifyError,
        "bad dimension 0 in f16[B, 0] of %x",
        "0]",   # the dimension itself
        valid="positive integers",
    ),
    Case(
        "bad_dimension_of_result",
        g(
            "%x: f16[B, 8]",
            "  %y = reshape(%x) {shape = [B, 8]} : f16[B, 8]\n  %z = silu(%y) : f16[B, -8]",
            "%z",
        ),
        VerifyError,
        "result types (f16[B, -8]) do not match",
        "silu",
        op="silu",
    ),
    Case(
        "attribute_given_twice",
        g(
            "%x: f16[B, 8], %w: f16[8]",
            "  %y = rms_norm(%x, %w) {eps = 1e-05, eps = 1e-06} : f16[B, 8]",
            "%y",
        ),
        ParseError,
        "attribute 'eps' given twice",
        "eps",
        nth=1,
    ),
    Case(
        "integer_too_long",
        g("%x: f16[B, " + "9" * 5000 + "]", "", "%x"),
        ParseError,
        "integer too long",
        "999",
    ),
    Case(
        "float_attribute_out_of_range",
        g(
            "%x: f16[B, 8], %w: f16[8]",
            "  %y = rms_norm(%x, %w) {eps = 1" + "0" * 400 + "} : f16[B, 8]",
            "%y",
        ),
        VerifyError,
        "out of the range of a double",
        "rms_norm",
        op="rms_norm",
    ),
    Case(
        "rope_symbolic_head_dim",
        g(
            "%x: f16[B, 4, D], %p: i32[B]",
            "  %y = rope(%x, %p) {theta = 10000.0, rotary_dim = 4} : f16[B, 4, D]",
            "%y",
        ),
        VerifyError,
        "rotary_dim = 4 with head_dim = D",
        "rope",
        op="rope",
        valid="a static head_dim",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rejected_with_its_message_and_location(case):
    with pytest.raises(FusionError) as info:
        parse_module(case.text)
    e = info.value
    assert type(e) is case.error, f"{type(e).__name__}: {e}"
    assert case.message in e.message, str(e)
    assert e.loc is not None and (e.loc.line, e.loc.col) == loc_of(case.text, case.at, case.nth), (
        f"{e} -- expected at {loc_of(case.text, case.at, case.nth)}"
    )
    assert str(e).startswith(f"{e.loc.line}:{e.loc.col}: "), str(e)
    if case.op is not None:
        assert e.op == case.op and f"'{case.op}'" in str(e), str(e)
    if case.valid is not None:
        assert case.valid in (e.valid or ""), str(e)


def test_each_mistake_has_its_own_message():
    """No two cases are told apart only by their location: each substring is specific."""
    messages = {}
    for c in CASES:
        try:
            parse_module(c.text)
        except FusionError as e:
            messages[c.id] = e.message
    for c in CASES:
        others = [i for i, m in messages.items() if c.message in m and i != c.id]
        assert not others or c.id in {
            "value_defined_twice",
            "result_redefines_parameter",
            "parameter_defined_twice",
        }, (c.id, others)


def test_file_name_in_location(tmp_path):
    from fusionc.ir import parse_file

    p = tmp_path / "bad.fir"
    p.write_text(CASES[0].text)
    with pytest.raises(VerifyError, match=r"bad\.fir:2:8: verify error: 'linear': "):
        parse_file(p)


def test_parse_file_missing(tmp_path):
    from fusionc.ir import parse_file

    with pytest.raises(ParseError, match="cannot read"):
        parse_file(tmp_path / "missing.fir")


# ----------------------------------------------------------------------------------------------
# valid graphs that look suspicious


ATTENTION_2048 = """graph @attn(%x: bf16[B, 2048], %norm_w: bf16[2048], %wq: bf16[4096, 2048], %wk: bf16[1024, 2048], %wv: bf16[1024, 2048], %wo: bf16[2048, 4096], %q_norm_w: bf16[128], %pos: i32[B], %kc: bf16[B, 4096, 8, 128], %vc: bf16[B, 4096, 8, 128], %lens: i32[B]) {
  %h = rms_norm(%x, %norm_w) {eps = 1e-06} : bf16[B, 2048]
  %q = linear(%h, %wq) : bf16[B, 4096]
  %k = linear(%h, %wk) : bf16[B, 1024]
  %v = linear(%h, %wv) : bf16[B, 1024]
  %qh = reshape(%q) {shape = [B, 32, 128]} : bf16[B, 32, 128]
  %kh = reshape(%k) {shape = [B, 8, 128]} : bf16[B, 8, 128]
  %vh = reshape(%v) {shape = [B, 8, 128]} : bf16[B, 8, 128]
  %qn = rms_norm(%qh, %q_norm_w) {eps = 1e-06} : bf16[B, 32, 128]
  %qr = rope(%qn, %pos) {theta = 1000000.0, style = neox, rotary_dim = 128} : bf16[B, 32, 128]
  %kr = rope(%kh, %pos) {theta = 1000000.0, style = neox, rotary_dim = 128} : bf16[B, 8, 128]
  %kc2, %vc2 = kv_cache_append(%kc, %vc, %kr, %vh, %pos) : bf16[B, 4096, 8, 128], bf16[B, 4096, 8, 128]
  %o = decode_attention(%qr, %kc2, %vc2, %lens) {scale = 0.08838834764831845} : bf16[B, 32, 128]
  %of = reshape(%o) {shape = [B, 4096]} : bf16[B, 4096]
  %y = linear(%of, %wo) : bf16[B, 2048]
  %r = add(%y, %x) : bf16[B, 2048]
  return %r, %kc2, %vc2
}
"""


def test_hidden_size_may_differ_from_heads_times_head_dim():
    """Qwen3 / Gemma: hidden 2048, 32 query heads × 128 = 4096 q features, 8 KV heads (GQA)."""
    m = parse_module(ATTENTION_2048)
    assert print_module(m) == ATTENTION_2048
    ops = {op.results[0].name: op for op in m["attn"].body}
    assert ops["q"].result.type == tensor("bf16", "B", 4096)
    assert ops["o"].result.type == tensor("bf16", "B", 32, 128)


@pytest.mark.parametrize("heads, kv_heads", [(32, 32), (32, 8), (32, 1), (12, 4)])
def test_mha_and_gqa_pass(heads, kv_heads):
    parse_module(
        g(
            f"%q: f16[B, {heads}, 64], %kc: f16[B, 256, {kv_heads}, 64], "
            f"%vc: f16[B, 256, {kv_heads}, 64], %n: i32[B]",
            f"  %o = decode_attention(%q, %kc, %vc, %n) {{scale = 0.125}} : f16[B, {heads}, 64]",
            "%o",
        )
    )


def test_cast_makes_mixed_dtypes_valid():
    parse_module(
        g(
            "%a: f16[B, 8], %b: f32[B, 8]",
            "  %c = cast(%b) {dtype = f16} : f16[B, 8]\n  %d = add(%a, %c) : f16[B, 8]",
            "%d",
        )
    )


# ----------------------------------------------------------------------------------------------
# modules built in Python (no text): same rules, no location


X = Value("x", tensor("f16", "B", 8))
W = Value("w", tensor("f16", 8))


def _module(*ops: Op, params=(X, W), outputs=()) -> Module:
    return Module((Graph("g", tuple(params), tuple(ops), tuple(outputs)),))


def _norm(result="y", x=X, attrs=(("eps", 1e-5),)):
    return Op("rms_norm", (Value(result, x.type),), (x, W), attrs)


def test_built_module_ok():
    verify_module(_module(_norm(), outputs=(Value("y", X.type),)))


@pytest.mark.parametrize(
    "module, message",
    [
        (lambda: _module(_norm(x=Value("zz", X.type))), "use of undefined value %zz"),
        (lambda: _module(_norm(), _norm()), "value %y is defined twice"),
        (
            lambda: _module(_norm(), outputs=(Value("nope", X.type),)),
            "use of undefined value %nope",
        ),
        (
            lambda: _module(_norm(x=Value("x", tensor("f32", "B", 8)))),
            "%x used as f32[B, 8] but defined as f16[B, 8]",
        ),
        (lambda: _module(Op("rms_nrm", (), (X, W), ())), "unknown op 'rms_nrm'"),
        (lambda: _module(_norm(attrs=())), " missing attribute 'eps'"),
        (lambda: _module(_norm(attrs=(("eps", 1),))), "not in canonical form"),
        (
            lambda: _module(
                Op("add", (Value("y", X.type),), (X, Value("w2", tensor("f32", "B", 8))), ()),
                params=(X, Value("w2", tensor("f32", "B", 8))),
            ),
            "mixed dtypes",
        ),
        (lambda: _module(params=(Value("bad name", X.type),)), "bad value name %bad name"),
        (lambda: Module((Graph("1g", (), (), ()),)), "bad name @1g"),
        (lambda: Module((Graph("g", (), (), (), kind="func"),)), "unknown item kind 'func'"),
    ],
)
def test_built_module_rejected(module, message):
    with pytest.raises(VerifyError) as info:
        verify_module(module())
    assert message.strip() in info.value.message, str(info.value)


def test_unknown_op_suggestion_in_verifier():
    with pytest.raises(VerifyError, match="did you mean rms_norm"):
        verify_module(_module(Op("rms_nrm", (), (X, W), ())))


def test_numpy_scalars_become_plain_attributes():
    np = pytest.importorskip("numpy")
    d = lookup("rms_norm")
    attrs = d.make_attrs({"eps": np.float64(1e-5)})
    assert type(attrs[0][1]) is float and "eps = 1e-05" in print_module(
        _module(Op("rms_norm", (Value("y", X.type),), (X, W), attrs))
    )
    axis = lookup("split").make_attrs({"axis": np.int64(-1), "sizes": [np.int32(4)] * 2})
    assert axis == (("axis", -1), ("sizes", (4, 4))) and type(axis[0][1]) is int
    with pytest.raises(VerifyError, match="expected a number, got true"):
        d.make_attrs({"eps": True})
