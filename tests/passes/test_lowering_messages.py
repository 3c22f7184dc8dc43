"""Issue 26 item 14: lowering errors say what is really wrong, and suggest only what was not
tried."""
import pytest

from fusionc.errors import LoweringError
from fusionc.ir import Module, parse_module, print_module
from fusionc.passes import run_pipeline
from tests.passes.graphs import example

def _graph_text(name: str, **sizes) -> str:
    m = example("llama2_7b", hidden=256, heads=2, intermediate=512, max_seq=64, **sizes)
    return print_module(Module((m[name],)))


def test_an_mlp_that_also_returns_the_activation_keeps_it_on_v2():
    """The SwiGLU output returned too: the gate/up kernel writes it, the down kernel reads it
    (v2's linears)."""
    from fusionc.passes.stream import v2_pipeline
    text = _graph_text("mlp").replace("  return %0\n", "  return %0, %act\n")
    low = run_pipeline(parse_module(text), v2_pipeline(4))
    launches = [op for op in low["mlp"].body if op.name == "launch"]
    assert len(launches) == 2 and launches[0].results[0].name == "act"


def _odd_forms():
    """Attention blocks in forms the units do not take: RoPE at positions other than the
    append's, and only q rotated."""
    text = _graph_text("attention").replace("%seq_lens: i32[B])", "%seq_lens: i32[B], "
                                            "%rope_pos: i32[B])")
    for x in ("q", "k"):
        text = text.replace(f"rope(%{x}_heads, %positions)", f"rope(%{x}_heads, %rope_pos)")
    only_q = _graph_text("attention").replace("%k_rot, %v_heads", "%k_heads, %v_heads")
    return {"rope positions": text, "only q rotated": only_q}


@pytest.mark.parametrize("form", ["rope positions", "only q rotated"])
def test_attention_forms_the_units_do_not_take(form):
    """The fused path names the attention and the block form; the default runs it on the
    mixed path's host attention, as the interpreter computes it."""
    import numpy as np
    from fusionc.interp import interpret
    from fusionc.passes.stream import v2_pipeline
    from fusionc.runtime.pipelines import v2_default_pipeline
    from fusionc.sim import simulate
    from tests.passes.graphs import inputs, rel_err
    m = parse_module(_odd_forms()[form])
    with pytest.raises(LoweringError, match="outside the block form") as info:
        run_pipeline(m, v2_pipeline(4))
    assert info.value.op == "decode_attention" and "mixed path" in info.value.valid
    g = m.graphs[0]
    pipe = v2_default_pipeline(g, 4)
    assert "host=true" in pipe
    rng = np.random.default_rng(3)
    args = inputs(g, 3, [17, 0, 64], rng)
    if "rope_pos" in args:
        args["rope_pos"] = rng.integers(0, 64, 3).astype(np.int32)
    for a, r in zip(simulate(run_pipeline(m, pipe), args), interpret(m, args)):
        assert rel_err(a, r) <= 2e-3
