"""fc.embedding: rows of a table by token id (type rules, the interpreter, run-time ids)."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import numpy as np
import pytest

import fusionc as fc
from fusionc.errors import FusionError, InputError, LoweringError


def _graph():
    @fc.graph
    def embed(table: fc.bf16[50, 8], tokens: fc.i32["B"], w: fc.bf16[4, 8]):
        return fc.linear(fc.embedding(table, tokens, name="h"), w, name="y")
    return embed


def test_rows_by_token_id_exactly():
    rng = np.random.default_rng(0)
    table, w = rng.standard_normal((50, 8)), rng.standard_normal((4, 8))
    tokens = np.array([3, 49, 0, 3], np.int32)
    y, = fc.interpret(_graph(), {"table": table, "tokens": tokens, "w": w}, precise=True)
    from fusionc.interp.numerics import round_to
    rows = np.asarray(round_to(table, fc.ir.DType.bf16), np.float64)[tokens]
    wr = np.asarray(round_to(w, fc.ir.DType.bf16), np.float64)
    np.testing.assert_allclose(y, rows @ wr.T, rtol=1e-12)


def test_ids_outside_the_table_are_named():
    args = {"table": np.zeros((50, 8)), "tokens": np.array([1, 50], np.int32),
            "w": np.zeros((4, 8))}
    with pytest.raises(InputError, match=r"tokens\[1\] = 50.*0 <= token < 50"):
        fc.interpret(_graph(), args)


@pytest.mark.parametrize("tokens", [fc.i64["B"], fc.i32["B", 2]])
def test_ill_typed_tokens_are_refused(tokens):
    with pytest.raises(FusionError, match="tokens"):
        fc.graph(lambda table, tokens: fc.embedding(table, tokens), name="g",
                 table=fc.f16[50, 8], tokens=tokens)


def test_lowering_v2_names_it():
    from fusionc.passes import run_pipeline
    from fusionc.passes.stream import v2_pipeline
    with pytest.raises(LoweringError, match="embedding"):
        run_pipeline(_graph(), v2_pipeline(4))


def test_the_text_form_reads_back():
    from fusionc.ir import parse_module, print_module
    text = print_module(_graph())
    assert "embedding(%table, %tokens)" in text
    assert print_module(parse_module(text)) == text
