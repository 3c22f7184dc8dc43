"""Pass fuse-allreduce-norm: all_reduce → add(residual) → rms_norm becomes one
all_reduce_add_rms_norm (reduce-scatter, per-shard add + RMSNorm, all-gather) with the same
bits on every simulated rank as the unfused graph, for 2 and 4 ranks and token counts that do
not divide evenly; anything else stays as it is."""
import numpy as np
import pytest

import fusionc as fc
from fusionc.errors import VerifyError
from fusionc.ir import parse_module, print_module
from fusionc.ir.ops.comm import token_shards
from fusionc.passes import run_pipeline
from tests.filecheck import filecheck

T = fc.f16


def block(group: int, hidden: int = 64):
    """The TP pattern after a row-parallel projection: h = residual + all_reduce(x);
    y = rms_norm(h)."""
    @fc.graph
    def tp(x: T["B", hidden], residual: T["B", hidden], w: T[hidden]):
        h = residual + fc.all_reduce(x, group, name="s")
        return fc.rms_norm(h, w, 1e-5, name="y"), h
    return tp


def rank_inputs(ranks: int, tokens: int, hidden: int = 64, seed: int = 0) -> list[dict]:
    """Per-rank partial sums x; the residual and weight replicated, as in tensor parallelism."""
    rng = np.random.default_rng(seed)
    res = rng.standard_normal((tokens, hidden)).astype(np.float16)
    w = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float16)
    return [{"x": rng.standard_normal((tokens, hidden)).astype(np.float16), "residual": res,
             "w": w} for _ in range(ranks)]


def test_the_chain_becomes_one_op():
    out = print_module(run_pipeline(block(2), "fuse-allreduce-norm"))
    filecheck(out, "CHECK: all_reduce_add_rms_norm(%x, %residual, %w) {group = 2, eps = 1e-05, "
                   "scope = nvlink}\nCHECK-NOT: all_reduce(\nCHECK-NOT: rms_norm(\n"
                   "CHECK: return %y")
    assert parse_module(out) == run_pipeline(block(2), "fuse-allreduce-norm")  # round trip


@pytest.mark.parametrize("ranks,group", [(2, 2), (4, 4), (4, 2)])
@pytest.mark.parametrize("tokens", [1, 3, 37, 1000, 1025])
def test_fused_equals_unfused_bitwise_on_every_rank(ranks, group, tokens):
    g = block(group)
    fused = run_pipeline(g, "fuse-allreduce-norm")
    ins = rank_inputs(ranks, tokens, seed=tokens)
    want, got = fc.interpret(g, ins), fc.interpret(fused, ins)
    for r in range(ranks):
        for a, b in zip(want[r], got[r]):
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), (r, tokens)
    for r in range(group):   # every rank of a group holds the same bits
        assert np.array_equal(got[r][0].view(np.uint16), got[0][0].view(np.uint16))


def test_token_shards_cover_every_row_once():
    for tokens in (0, 1, 3, 7, 8, 1025):
        for group in (1, 2, 3, 4, 8):
            rows = [i for s in token_shards(tokens, group) for i in range(tokens)[s]]
            assert rows == list(range(tokens))


def test_other_uses_and_lone_all_reduce_are_left_alone():
    @fc.graph
    def used_twice(x: T["B", 64], residual: T["B", 64], w: T[64]):
        s = fc.all_reduce(x, 2, name="s")
        return fc.rms_norm(residual + s, w, 1e-5), s
    assert "all_reduce(" in print_module(run_pipeline(used_twice, "fuse-allreduce-norm"))

    @fc.graph
    def lone(x: T["B", 64]):
        return fc.all_reduce(x, 2) * x
    assert run_pipeline(lone, "fuse-allreduce-norm") == lone


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("tokens", [1, 37, 1025])
def test_all_reduce_then_add_becomes_all_reduce_add(ranks, tokens):
    @fc.graph
    def tail(x: T["B", 64], residual: T["B", 64]):
        return residual + fc.all_reduce(x, ranks, name="s")
    fused = run_pipeline(tail, "fuse-allreduce-norm")
    filecheck(print_module(fused), f"CHECK: all_reduce_add(%x, %residual) {{group = {ranks}, "
                                   "scope = nvlink}\nCHECK-NOT: add(")
    assert parse_module(print_module(fused)) == fused
    ins = [{k: v for k, v in d.items() if k != "w"} for d in rank_inputs(ranks, tokens)]
    for want, got in zip(fc.interpret(tail, ins), fc.interpret(fused, ins)):
        assert np.array_equal(want[0].view(np.uint16), got[0].view(np.uint16))


def test_the_fused_op_checks_its_operands():
    text = ("graph @g(%x: f16[B, 64], %r: f16[B, 32], %w: f16[64]) {\n"
            "  %y, %h = all_reduce_add_rms_norm(%x, %r, %w) {group = 2, eps = 1e-05} "
            ": f16[B, 64], f16[B, 64]\n  return %y\n}\n")
    with pytest.raises(VerifyError, match="residual"):
        parse_module(text)
