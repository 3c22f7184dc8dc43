"""Prompts in chunks on the CPU (``kv_cache_write``, ``chunk_attention``,
``HostDecoder.prefill``): the logits after a chunked prompt equal those after one decode step
per token within the 16-bit budget, whatever the chunk size and prompt lengths; the ops check
their rows; ``generate`` prefills in chunks by default."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import numpy as np
import pytest

import fusionc as fc
from fusionc.errors import FusionError, InputError, LoweringError
from fusionc.models import HostDecoder, generate
from fusionc.models.prefill import chunks
from fusionc.models.random import write_random_model


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module", params=[("llama", "float16"), ("qwen3", "bfloat16"),
                                        ("qwen2", "float16")])
def model(request, tmp_path_factory):
    kind, dtype = request.param
    d = tmp_path_factory.mktemp("prefill") / f"{kind}-{dtype}"
    write_random_model(d, kind, num_hidden_layers=2, dtype=dtype)
    return d


def _stepwise(model, prompt):
    """Logits after each sequence's last prompt token, one decode step per token."""
    dec = HostDecoder.from_pretrained(model, batch=1, max_seq=32)
    return generate(dec, prompt, 1, prefill=False, keep_logits=True).logits[len(prompt) - 1][0]


@pytest.mark.parametrize("chunk", [1, 3, 7, 256])
def test_chunked_prompts_give_the_logits_of_token_steps(model, chunk):
    rng = np.random.default_rng(chunk)
    prompts = [rng.integers(0, 80, 11), rng.integers(0, 80, 4)]   # different lengths
    dec = HostDecoder.from_pretrained(model, batch=2, max_seq=32)
    got = dec.prefill(prompts, chunk=chunk)
    for b, p in enumerate(prompts):
        assert rel(got[b], _stepwise(model, p)) <= 1e-2


def test_decoding_goes_on_after_a_chunked_prompt(model):
    rng = np.random.default_rng(5)
    p = rng.integers(0, 80, (2, 9))
    dec = HostDecoder.from_pretrained(model, batch=2, max_seq=32)
    a = generate(dec, p, 6, prefill=False)
    b = generate(dec, p, 6)             # chunked by default
    assert np.array_equal(a.tokens, b.tokens)


def test_the_chunk_plan_keeps_a_sequence_s_rows_together():
    got = chunks([3, 0, 2], [0, 0, 5], chunk=2)
    assert [list(s) for s, _, _ in got] == [[0, 0], [0, 2], [2]]
    assert [list(p) for _, p, _ in got] == [[0, 1], [2, 5], [6]]
    with pytest.raises(InputError, match="a positive number of rows"):
        chunks([1], [0], chunk=0)


def _graph(max_seq=8):
    @fc.graph
    def g(k_cache: fc.f16["N", max_seq, 2, 16], v_cache: fc.f16["N", max_seq, 2, 16],
          q: fc.f16["T", 4, 16], k: fc.f16["T", 2, 16], v: fc.f16["T", 2, 16],
          seq_of: fc.i32["T"], positions: fc.i32["T"]):
        kc, vc = fc.kv_cache_write(k_cache, v_cache, k, v, seq_of, positions)
        return fc.chunk_attention(q, kc, vc, seq_of, positions), kc, vc
    return g


def _args(seq_of, positions, n=2, max_seq=8, seed=0):
    rng = np.random.default_rng(seed)
    t = len(seq_of)
    return {"k_cache": rng.standard_normal((n, max_seq, 2, 16)),
            "v_cache": rng.standard_normal((n, max_seq, 2, 16)),
            "q": rng.standard_normal((t, 4, 16)), "k": rng.standard_normal((t, 2, 16)),
            "v": rng.standard_normal((t, 2, 16)), "seq_of": np.array(seq_of, np.int32),
            "positions": np.array(positions, np.int32)}


def test_chunk_attention_equals_decode_attention_row_by_row():
    """Each row of a chunk as one decode step of its sequence (writes in row order)."""
    args = _args([0, 0, 0, 1, 1], [2, 3, 4, 0, 1])
    o, kc, vc = fc.interpret(_graph(), args, precise=True)
    kd, vd = args["k_cache"].copy(), args["v_cache"].copy()
    for t, (s, p) in enumerate(zip(args["seq_of"], args["positions"])):
        kd[s, p], vd[s, p] = args["k"][t], args["v"][t]
        k, v = kd[s, :p + 1].astype(np.float16), vd[s, :p + 1].astype(np.float16)
        q = args["q"][t].astype(np.float16).astype(np.float64).reshape(2, 2, 16)
        sc = np.einsum("kgd,nkd->kgn", q, k.astype(np.float64)) / 4.0
        w = np.exp(sc - sc.max(-1, keepdims=True))
        ref = np.einsum("kgn,nkd->kgd", w / w.sum(-1, keepdims=True), v.astype(np.float64))
        assert rel(o[t], ref.reshape(4, 16)) < 1e-6
    assert np.array_equal(kc[0, 2:5], args["k"][:3].astype(np.float16))


@pytest.mark.parametrize("seq_of, positions, match", [
    ([0, 0], [3, 5], "consecutive positions within a sequence"),
    ([0, 1, 0], [0, 0, 1], "sequence 0 in two runs of rows"),
    ([2, 2], [0, 1], r"seq_of\[0\] = 2 is outside the cache"),
    ([0, 0], [7, 8], r"positions\[1\] = 8 is outside the cache"),
])
def test_bad_rows_are_named(seq_of, positions, match):
    with pytest.raises(InputError, match=match):
        fc.interpret(_graph(), _args(seq_of, positions))


def test_ill_typed_chunks_are_refused_at_their_line():
    with pytest.raises(FusionError, match="seq_of has type"):
        @fc.graph
        def g(k_cache: fc.f16["N", 8, 2, 16], v_cache: fc.f16["N", 8, 2, 16],
              k: fc.f16["T", 2, 16], seq_of: fc.i32["T", 2], positions: fc.i32["T"]):
            return fc.kv_cache_write(k_cache, v_cache, k, k, seq_of, positions)


def test_lowerings_name_what_they_do_not_take_yet():
    from fusionc.passes import run_pipeline
    from fusionc.passes.stream import v2_pipeline
    with pytest.raises(LoweringError, match="kv_cache_write"):
        run_pipeline(_graph(), v2_pipeline(4))


def test_prefill_errors(model):
    dec = HostDecoder.from_pretrained(model, batch=2, max_seq=8)
    for bad, match in (([[1, 2]], "prompts of lengths"), ([[1], []], "prompts of lengths"),
                       ([[1] * 9, [1]], "prompts of lengths"), ([[1], [500]], "ids of prompt 1")):
        with pytest.raises(InputError, match=match):
            dec.prefill(bad)
    with pytest.raises(InputError, match="prefill with a"):
        generate(object.__new__(_NoPrefill), [1], 1, prefill=True)


class _NoPrefill:
    batch, max_seq = 1, 8



def test_the_chunk_size_is_checked(model):
    rng = np.random.default_rng(9)
    p = rng.integers(0, 80, 7)
    dec = HostDecoder.from_pretrained(model, batch=1, max_seq=16)
    a = dec.prefill([p], chunk=np.int64(3))
    assert rel(a, dec.prefill([p])) <= 1e-2
    with pytest.raises(InputError, match="a positive number of rows"):
        dec.prefill([p], chunk=0)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_on_the_gpu_a_chunk_compiles_to_library_calls(qk_norm):
    """``fusionc.compile`` of ``@attention_chunk`` (no GPU needed): the default is v2's library
    path — GEMMs, RMSNorm (QK-norm over [T, heads, D] too), RoPE, the cache write and the
    attention as host ops, no kernel of fusionc's own."""
    from fusionc.models.prefill import chunk_attention_block
    m = chunk_attention_block(hidden=256, heads=8, kv_heads=2, head_dim=64, max_seq=64,
                              eps=1e-5, theta=1e4, dtype="bf16", qk_norm=qk_norm)
    cg = fc.compile(m, max_batch=256)
    names = [op.name for op in cg.host.body]
    assert not cg.kernels and names.count("library_call") == 2
    assert {"rope", "kv_cache_write", "chunk_attention"} <= set(names)
    assert names.count("rms_norm") == (3 if qk_norm else 1)


def test_prompts_and_tokens_of_the_wrong_kind_are_named(model):
    dec = HostDecoder.from_pretrained(model, batch=2, max_seq=32)
    with pytest.raises(InputError, match="a list of 2 lists"):
        dec.prefill({0: [1], 1: [2]})
    with pytest.raises(InputError, match="integers"):
        dec.step({0: 1, 1: 2}, [1, 1])
