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


def test_mlp_that_also_returns_the_activation():
    text = _graph_text("mlp").replace("  return %0\n", "  return %0, %act\n")
    with pytest.raises(LoweringError) as info:
        _lower(text)
    msg = str(info.value)
    assert "'silu_mul'" in msg and "%act is returned" in msg, msg
    assert "not followed by a down projection" not in msg
    two = _graph_text("mlp").replace("  return %0\n", "  %1 = add(%act, %act) : f16[B, 512]\n"
                                                      "  return %0, %1\n")
    with pytest.raises(LoweringError, match="%act is used by 2 ops"):
        _lower(two)


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


@pytest.mark.parametrize("pipeline, search", [("partition-cluster", False),
                                              ("partition-cluster{size=4}", True)])
def test_an_intermediate_size_that_splits_over_no_grid(pipeline, search):
    text = _graph_text("mlp", **{}).replace("512", "11006").replace("1024", "22012")
    with pytest.raises(LoweringError) as info:
        _lower(text, pipeline)
    msg = str(info.value)
    assert "intermediate 11006 splits over no grid" in msg and "e.g. 11008" in msg, msg
    assert ("size=0" in msg) == search
