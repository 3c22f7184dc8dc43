"""Issue 26 item 14: lowering errors say what is really wrong, and suggest only what was not
tried."""
import pytest

from fusionc.errors import LoweringError
from fusionc.ir import Module, parse_module, print_module
from fusionc.passes import run_pipeline
from tests.passes.graphs import example

PARTITION = "partition-cluster{size=2}"


def _graph_text(name: str, **sizes) -> str:
    m = example("llama2_7b", hidden=256, heads=2, intermediate=512, max_seq=64, **sizes)
    return print_module(Module((m[name],)))


def _lower(text: str, pipeline: str = PARTITION):
    return run_pipeline(parse_module(text), pipeline)


def test_an_mlp_that_also_returns_the_activation_keeps_it_on_v2():
    """The SwiGLU output returned too: the gate/up kernel writes it, the down kernel reads it
    (v2's linears; v1 has no MLP kernel of its own)."""
    from fusionc.passes.stream import v2_pipeline
    text = _graph_text("mlp").replace("  return %0\n", "  return %0, %act\n")
    low = run_pipeline(parse_module(text), v2_pipeline(4))
    launches = [op for op in low["mlp"].body if op.name == "launch"]
    assert len(launches) == 2 and launches[0].results[0].name == "act"


def test_rope_positions_other_than_the_append_positions():
    text = _graph_text("attention").replace("%seq_lens: i32[B])", "%seq_lens: i32[B], "
                                            "%rope_pos: i32[B])")
    for x in ("q", "k"):
        text = text.replace(f"rope(%{x}_heads, %positions)", f"rope(%{x}_heads, %rope_pos)")
    with pytest.raises(LoweringError) as info:
        _lower(text)
    msg = str(info.value)
    assert "RoPE takes positions %rope_pos, the KV append %positions" in msg, msg
    assert "different RoPE" not in msg and "one positions input" in msg
    only_q = _graph_text("attention").replace("%k_rot, %v_heads", "%k_heads, %v_heads")
    with pytest.raises(LoweringError, match="only q is rotated"):
        _lower(only_q)
