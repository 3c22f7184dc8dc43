"""Pass split-tokens (token-split overlap, TokenWeave) and pass lower-library: structure and
streams, text round trip, the wave-aware split rule, and the same bits as the unsplit graph in
the interpreter and the simulator over 2 and 4 simulated ranks."""
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusionc as fc
from fusionc.commands.compile import random_inputs
from fusionc.errors import PassError
from fusionc.ir import parse_module, print_module
from fusionc.ir.ops.tokens import split_sizes
from fusionc.passes import run_pipeline
from tests.filecheck import filecheck

sys.path.insert(0, "examples")
import tp2_llama_layer  # noqa: E402
import tp2_mlp  # noqa: E402

SPLIT = "fuse-allreduce-norm,split-tokens{parts=%d,min_tokens=%d,tile=4},lower-library"


def _mlp(tp=2):
    return tp2_mlp.build(hidden=64, intermediate=128, tp=tp)


def _oproj(tp=2):
    return fc.module(tp2_llama_layer.build(hidden=64, heads=4, kv_heads=4, head_dim=16,
                                           intermediate=128, tp=tp, max_seq=8)["o_proj"])


def test_blocks_streams_and_round_trip():
    out = run_pipeline(_mlp(), SPLIT % (2, 8))
    filecheck(print_module(out), "\n".join([
        "CHECK: %x.0, %x.1 = token_split(%x) {parts = 2, min_tokens = 8, tile = 4, n_tiles = 1",
        "CHECK: library_call(%h.0, %w_gate_up) {fn = cublas_gemm}",
        "CHECK: all_reduce_add(%partial.0, %x.0) {group = 2, scope = nvlink, stream = 1}",
        "CHECK: library_call(%h.1, %w_gate_up)",
        "CHECK: all_reduce_add(%partial.1, %x.1) {group = 2, scope = nvlink}",
        "CHECK: token_concat(%0.0, %0.1) : f16[B, 64]"]))
    assert parse_module(print_module(out)) == out


def test_concat_of_part_of_the_blocks_is_refused():
    from fusionc.errors import VerifyError
    text = ("graph @g(%x: f16[B, 8]) {\n"
            "  %a, %b, %c = token_split(%x) {parts = 3} : f16[B.0, 8], f16[B.1, 8], f16[B.2, 8]\n"
            "  %y = token_concat(%a, %b) : f16[B, 8]\n  return %y\n}\n")
    with pytest.raises(VerifyError, match="blocks"):
        parse_module(text)
    with pytest.raises(VerifyError, match="stream"):
        parse_module("graph @g(%x: f16[B, 8]) {\n  %y = all_reduce(%x) {group = 2, stream = 7}"
                     " : f16[B, 8]\n  return %y\n}\n")


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("T", [1, 7, 8, 9, 31, 33, 1023, 1025])
def test_split_equals_unsplit(ranks, parts, T):
    """float64 (precise): equal up to the order of the GEMM sums, which numpy's BLAS picks by
    matrix size; f32 with the dtype roundings (interpreter and simulator): within fp16
    tolerance, and the collectives give the same bits on every rank."""
    for m in (_mlp(ranks), _oproj(ranks)):
        g = m.graphs[0]
        split = run_pipeline(m, SPLIT % (parts, 8))
        rng = np.random.default_rng(T)
        ins = random_inputs(g, T, rng)
        per_rank = [dict(ins, **{p.name: ins[p.name] * (1 + r) for p in g.params
                                 if p.name in ("w_down", "o")}) for r in range(ranks)]
        exact = fc.interpret(m, per_rank, precise=True)
        for r, out in enumerate(fc.interpret(split, per_rank, precise=True)):
            for a, b in zip(exact[r], out):
                assert np.allclose(a, b, rtol=1e-12, atol=1e-12), (g.name, r)
        want = fc.interpret(m, per_rank)
        for got in (fc.interpret(split, per_rank), fc.simulate(split, per_rank)):
            for r in range(ranks):
                for a, b in zip(want[r], got[r]):
                    a, b = a.astype(np.float64), b.astype(np.float64)
                    assert np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(a), (g.name, r)
                    assert np.array_equal(got[r][0], got[0][0])


@settings(max_examples=200, deadline=None)
@given(T=st.integers(0, 20000), parts=st.integers(1, 4), n_tiles=st.integers(1, 200),
       min_tokens=st.sampled_from([0, 1024]))
def test_split_sizes(T, parts, n_tiles, min_tokens):
    sizes = split_sizes(T, parts, min_tokens, 128, n_tiles, 132)
    assert len(sizes) == parts and sum(sizes) == T and min(sizes) >= 0
    if T < max(min_tokens, parts * 128):
        assert sizes[-1] == T   # no split: the last block (collective on the compute stream)
        return
    assert all(s % 128 == 0 for s in sizes[:-1])   # GEMM tile boundaries
    per_wave = max(1, 132 // n_tiles) * 128
    if T >= 2 * parts * per_wave:                   # whole waves for every block but the last
        assert all(s % per_wave == 0 for s in sizes[:-1])


def test_wave_rule_on_the_llama2_mlp():
    # TP=2 gate/up GEMM: 11008 columns = 43 tiles of 256 -> 3 M-tiles (384 rows) per wave
    assert split_sizes(2048, 2, 1024, 128, 43) == [1152, 896]
    assert split_sizes(8192, 2, 1024, 128, 43) == [4224, 3968]
    assert split_sizes(1000, 2, 1024, 128, 43) == [0, 1000]    # below the threshold


def test_graphs_that_are_not_row_wise_are_refused():
    layer = tp2_llama_layer.build(hidden=64, heads=4, kv_heads=4, head_dim=16,
                                  intermediate=128, max_seq=8)
    with pytest.raises(PassError, match="does not work row by row"):
        run_pipeline(fc.module(layer["layer"]), "split-tokens")


def test_compile_picks_the_library_pipeline_for_many_tokens():
    g = _mlp().graphs[0]
    fn = fc.compile(g, max_batch=4096, split_tokens=2)
    names = [op.name for op in fn.host.body]
    assert names[0] == "token_split" and names.count("library_call") == 4 and not fn.kernels
    assert [op.attr("stream") for op in fn.host.body if op.name == "all_reduce_add"] == [1, 0]
    decode = fc.compile(g, max_batch=4)
    assert [op.name for op in decode.host.body] == ["launch", "all_reduce_add"]


def test_outputs_that_are_params_or_repeated_and_name_clashes():
    @fc.graph
    def g(x: fc.f16["B", 8], w: fc.f16[8, 8]):
        y = fc.linear(x, w, name="x.1")   # the name a block of x would take
        return y, y, x
    split = run_pipeline(g, "split-tokens{parts=2,min_tokens=0,tile=1}")
    assert parse_module(print_module(split)) == split
    ins = {"x": np.arange(24, dtype=np.float16).reshape(3, 8), "w": np.eye(8)}
    for a, b in zip(fc.interpret(g, ins, precise=True), fc.interpret(split, ins, precise=True)):
        assert np.array_equal(a, b)


def test_bad_split_requests_are_refused():
    from fusionc.errors import InputError, VerifyError
    with pytest.raises(PassError, match="parts <= 64"):
        run_pipeline(_mlp(), "split-tokens{parts=100000}")
    with pytest.raises(PassError, match="already split"):
        run_pipeline(run_pipeline(_mlp(), SPLIT % (2, 8)), "split-tokens")
    with pytest.raises(VerifyError, match="token_split"):
        parse_module("graph @g(%z: f16[B.0, 8], %w: f16[B.1, 8]) {\n"
                     "  %y = token_concat(%z, %w) : f16[B, 8]\n  return %y\n}\n")
    for bad in ((-5, 2), (100, 0), (100, 2, 1024, 0), (100, 2, 1024, 128, 0)):
        with pytest.raises(InputError, match="split_sizes"):
            split_sizes(*bad)
    g = _mlp().graphs[0]
    for kw in ({"side_ctas": 1000}, {"min_split_tokens": None}, {"split_tokens": 0},
               {"split_tokens": 65}):
        with pytest.raises(InputError):
            fc.compile(g, max_batch=4096, **kw)


def test_an_embedding_splits_by_its_token_ids():
    """The token ids are cut into blocks, the table is not: same rows over two ranks."""
    import numpy as np
    import fusionc as fc
    from fusionc.passes import run_pipeline

    @fc.graph
    def g(table: fc.f16[50, 16], tokens: fc.i32["B"], w: fc.f16[8, 16]):
        return fc.linear(fc.all_reduce(fc.embedding(table, tokens), 2), w)
    low = run_pipeline(g, "split-tokens{parts=2,min_tokens=0},lower-library")
    rng = np.random.default_rng(0)
    ins = [{"table": rng.standard_normal((50, 16)), "tokens": rng.integers(0, 50, 5),
            "w": rng.standard_normal((8, 16))} for _ in range(2)]
    ins[1]["table"], ins[1]["tokens"] = ins[0]["table"], ins[0]["tokens"]
    for a, b in zip(fc.simulate(low, ins), fc.interpret(g, ins)):
        assert np.array_equal(a[0], b[0])
    assert fc.compile(g, max_batch=4).host is not None
