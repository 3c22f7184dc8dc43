"""Pass fold-views: views (reshape, split_heads, merge_heads) move past elementwise ops and
cancel; the folded graph computes the same bits as the original in the interpreter and lowers
on v2 (fused kernels and the library path); views that do not cancel are named by the passes
after it."""
import numpy as np
import pytest

import fusionc as fc
from fusionc.errors import FusionError
from fusionc.interp import interpret
from fusionc.ir import parse_module, print_module
from fusionc.passes import run_pipeline
from fusionc.passes.stream import v2_pipeline
from fusionc.sim import simulate
from tests.filecheck import filecheck

T = fc.f16


def heads_graph(n: int = 64, k: int = 64, h: int = 4):
    @fc.graph
    def heads(x: T["B", k], w1: T[n, k], w2: T[k, n], t: T["B", n]):
        a = fc.silu(fc.split_heads(fc.linear(x, w1, name="h"), h, name="hh"), name="a")
        b = a * fc.split_heads(t, h, name="th")   # both operands views of [B, n]
        return fc.linear(fc.merge_heads(b, name="m"), w2, name="y")
    return heads


def _inputs(m, batch, rng):
    out = {}
    for p in m.graphs[0].params:
        shape = tuple(batch if isinstance(s, str) else s for s in p.type.shape)
        out[p.name] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float16)
    return out


def test_views_sink_past_elementwise_ops_and_cancel():
    out = print_module(run_pipeline(heads_graph(), "fold-views"))
    filecheck(out, """
        CHECK: %h = linear(%x, %w1)
        CHECK-NEXT: %a.flat = silu(%h) : f16[B, 64]
        CHECK-NEXT: %{{[0-9]+}}.flat = mul(%a.flat, %t) : f16[B, 64]
        CHECK-NEXT: %y = linear(%{{[0-9]+}}.flat, %w2)
        CHECK-NOT: reshape
        CHECK: return %y""")
    assert parse_module(out) == run_pipeline(heads_graph(), "fold-views")   # round trip


def test_the_folded_graph_computes_the_same_bits():
    g = heads_graph()
    args = _inputs(g, 3, np.random.default_rng(0))
    want, = interpret(g, args)
    got, = interpret(run_pipeline(g, "fold-views"), args)
    assert np.array_equal(want.view(np.uint16), got.view(np.uint16))


@pytest.mark.parametrize("rows", [64, 128])
def test_the_heads_graph_is_one_fused_kernel_that_simulates_like_the_interpreter(rows):
    g = heads_graph(n=200, k=136)
    low = run_pipeline(g, v2_pipeline(4, chain=True, rows=rows))
    assert [op.name for op in low["heads"].body] == ["launch"]
    args = _inputs(g, 3, np.random.default_rng(1))
    ref, = interpret(g, args, precise=True)
    out, = simulate(low, args)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) <= 1e-2


def test_the_library_path_runs_the_folded_graph():
    from fusionc.runtime.pipelines import library_pipeline
    low = run_pipeline(heads_graph(), library_pipeline(heads_graph()["heads"]))
    assert [op.name for op in low["heads"].body] == ["library_call", "silu", "mul",
                                                     "library_call"]


def test_double_and_identity_views_go():
    @fc.graph
    def g(x: T["B", 64], w: T[32, 64]):
        v = fc.reshape(fc.reshape(x, "B", 4, 16), "B", 2, 32)
        return fc.linear(fc.reshape(v, "B", 64), w, name="y")
    low = run_pipeline(g, "fold-views")
    assert [op.name for op in low["g"].body] == ["linear"]
    assert low["g"].body[0].operands[0].name == "x"


def test_an_output_view_that_cancels_names_its_producer():
    @fc.graph
    def g(x: T["B", 64], w: T[64, 64]):
        h = fc.silu(fc.split_heads(fc.linear(x, w, name="h"), 4), name="a")
        return fc.merge_heads(h, name="y")
    low = run_pipeline(g, "fold-views")
    assert [(op.name, op.result.name) for op in low["g"].body] == [("linear", "h"),
                                                                  ("silu", "y")]
    assert [v.name for v in low["g"].outputs] == ["y"]
    args = _inputs(g, 2, np.random.default_rng(2))
    assert np.array_equal(interpret(g, args)[0], interpret(low, args)[0])
    run_pipeline(g, v2_pipeline(2))   # lowers: one kernel


def test_views_that_do_not_cancel_stay_and_are_named():
    @fc.graph
    def g(x: T["B", 64], w: T[64, 64]):
        return fc.split_heads(fc.silu(fc.linear(x, w, name="h")), 4, name="q")   # output view
    low = run_pipeline(g, "fold-views")
    assert [op.name for op in low["g"].body] == ["linear", "silu", "reshape"]
    with pytest.raises(FusionError, match=r"'reshape'.*a view that fold-views does not cancel"):
        run_pipeline(g, v2_pipeline(2))


def test_views_of_different_shapes_do_not_sink():
    @fc.graph
    def g(a: T["B", 4, 16], b: T["B", 8, 8]):
        return fc.reshape(a, "B", 64) + fc.reshape(b, "B", 64)
    low = run_pipeline(g, "fold-views")
    assert [op.name for op in low["g"].body] == ["reshape", "reshape", "add"]


def test_fusionc_ir_shows_the_pass(tmp_path, capsys):
    from fusionc.cli import main
    src = tmp_path / "heads.py"
    src.write_text("import fusionc as fc\nT = fc.f16\n\n\n@fc.graph\n"
                   "def heads(x: T['B', 64], w1: T[64, 64], w2: T[64, 64]):\n"
                   "    h = fc.silu(fc.split_heads(fc.linear(x, w1, name='h'), 4))\n"
                   "    return fc.linear(fc.merge_heads(h), w2, name='y')\n\n\nmodule = heads\n")
    assert main(["ir", str(src), "--lowering", "v2", "--after", "fold-views"]) == 0
    filecheck(capsys.readouterr().out, "CHECK: silu(%h) : f16[B, 64]\nCHECK-NOT: reshape")


def test_an_output_add_of_two_views_folds():
    @fc.graph
    def g(x: T["B", 64], w: T[64, 64]):
        s = fc.split_heads(fc.linear(x, w, name="h"), 4) + fc.split_heads(x, 4)
        return fc.merge_heads(s, name="y")
    low = run_pipeline(g, "fold-views")
    assert [op.name for op in low["g"].body] == ["linear", "add"]
    assert low["g"].body[-1].result.name == "y"
