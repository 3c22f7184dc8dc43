"""DSL mistakes raise DSLError at the user's file:line, naming the op and what is valid."""
import sys

import pytest

import fusionc as fc
from fusionc import f16, i32
from fusionc.errors import DSLError


def _here() -> int:
    """The caller's line number."""
    return sys._getframe(1).f_lineno


def _next_line() -> int:
    return sys._getframe(1).f_lineno + 1


def _raises_at(line: int, *fragments: str):
    """Context manager: a DSLError whose message has this file, ``line`` and ``fragments``."""
    class _Check:
        def __enter__(self):
            self.cm = pytest.raises(DSLError)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.cm.__exit__(*exc)
            msg = str(self.info.value)
            assert f"{__file__}:{line}:" in msg, msg
            for f in fragments:
                assert f in msg, msg
            return handled
    return _Check()


def test_linear_shape_mismatch_points_at_the_user_line():
    line = [0]
    with _raises_at(_here() + 6, "'linear'", "input features", "valid:") as info:

        @fc.graph
        def bad(x: f16["B", 64], w: f16[128, 32]):
            h = fc.silu(x)
            line[0] = _next_line()
            return fc.linear(h, w)
    assert line[0] == info.value.loc.line
    assert info.value.loc.file == __file__


def test_mixed_dtypes():
    with _raises_at(_here() + 4, "'add'", "mixed dtypes", "cast"):

        @fc.graph
        def bad(x: f16["B", 8], y: fc.bf16["B", 8]):
            return x + y


def test_bad_rope_and_gqa_and_attrs():
    with _raises_at(_here() + 4, "'rope'", "rotary_dim = 5"):

        @fc.graph
        def bad_rope(x: f16["B", 2, 8], p: i32["B"]):
            return fc.rope(x, p, 10000.0, rotary_dim=5)

    with _raises_at(_here() + 5, "'decode_attention'", "does not divide"):

        @fc.graph
        def bad_gqa(q: f16["B", 6, 8], k: f16["B", 16, 4, 8], v: f16["B", 16, 4, 8],
                    n: i32["B"]):
            return fc.decode_attention(q, k, v, n)

    with _raises_at(_here() + 4, "'rope'", "style", "neox, gptj"):

        @fc.graph
        def bad_style(x: f16["B", 2, 8], p: i32["B"]):
            return fc.rope(x, p, 10000.0, style="llama")


def test_reshape_and_split_mistakes():
    with _raises_at(_here() + 4, "'reshape'", "element counts differ"):

        @fc.graph
        def bad(x: f16["B", 8]):
            return fc.reshape(x, "B", 3, 3)

    with _raises_at(_here() + 4, "'split'", "do not add up"):

        @fc.graph
        def bad2(x: f16["B", 8]):
            return fc.split(x, [3, 3])[0]

    with _raises_at(_here() + 4, "split_heads"):

        @fc.graph
        def bad3(x: f16["B", 8]):
            return fc.split_heads(x, 3)


def test_scalar_operand_and_truth_value():
    with _raises_at(_here() + 4, "'mul'", "not a tensor"):

        @fc.graph
        def bad(x: f16["B", 8]):
            return 2.0 * x

    with _raises_at(_here() + 4, "no truth value"):

        @fc.graph
        def bad2(x: f16["B", 8]):
            return x if x else fc.silu(x)

    with _raises_at(_here() + 4, "cannot iterate", "split"):

        @fc.graph
        def bad3(x: f16["B", 8]):
            a, b = x
            return a


def test_tensors_of_another_graph_or_after_tracing():
    leaked = []

    @fc.graph
    def g(x: f16["B", 8]):
        leaked.append(x)
        return fc.silu(x)

    with _raises_at(_here() + 1, "finished tracing"):
        fc.silu(leaked[0])

    with _raises_at(_here() + 4, "belongs to graph @g"):

        @fc.graph
        def h(y: f16["B", 8]):
            return y + leaked[0]


def test_declaration_mistakes():
    with pytest.raises(DSLError, match="parameter 'w' has no tensor type"):
        @fc.graph
        def no_type(x: f16["B", 8], w):
            return x

    with pytest.raises(DSLError, match="annotated fusionc.f16, not a tensor type"):
        @fc.graph
        def bare_dtype(x: f16):
            return x

    with pytest.raises(DSLError, match="unknown parameters \\['y'\\]"):
        @fc.graph(y=fc.Tensor("f16", 4))
        def extra(x: f16[4]):
            return x

    with pytest.raises(DSLError, match="returns a float"):
        @fc.graph
        def returns_float(x: f16[4]):
            return 1.0

    with pytest.raises(DSLError, match="bad dimension 0"):
        f16["B", 0]
    with pytest.raises(DSLError, match="unknown dtype 'f8'"):
        fc.Tensor("f8", 4)


def test_bad_value_name_and_name_count():
    with _raises_at(_here() + 4, "bad value name 'a b'"):

        @fc.graph
        def bad(x: f16["B", 8]):
            return fc.silu(x, name="a b")

    with _raises_at(_here() + 4, "2 names given for 3 results"):

        @fc.graph
        def bad2(x: f16["B", 9]):
            return fc.split(x, [3, 3, 3], name=("a", "b"))[0]


def test_string_annotation_with_enclosing_size_explains_the_fix():
    def outer(n):
        def f(x: "f16['B', n]"):
            return x
        return fc.trace(f)

    with pytest.raises(DSLError, match="declare the input in the decorator"):
        outer(4)
