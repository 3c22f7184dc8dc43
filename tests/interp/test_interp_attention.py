"""kv_cache_append and decode_attention (MHA, GQA) against loops over rows and heads."""
import numpy as np
import pytest

import fusionc as fc
from fusionc.errors import InputError


def rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def attention_ref(q, kc, vc, lens, scale):
    """softmax(scale · q·kᵀ) · v per row b and head h over the first lens[b] tokens, float64;
    head h uses KV head h // (H / Hkv)."""
    B, H, D = q.shape
    group = H // kc.shape[2]
    out = np.zeros((B, H, D))
    for b in range(B):
        n = lens[b]
        for h in range(H):
            if n == 0:
                continue
            k = kc[b, :n, h // group].astype(np.float64)
            v = vc[b, :n, h // group].astype(np.float64)
            s = scale * (k @ q[b, h].astype(np.float64))
            p = np.exp(s - s.max())
            out[b, h] = (p / p.sum()) @ v
    return out


def attention_graph(dtype, heads, kv_heads, head_dim, max_seq, scale):
    T = fc.dtype(dtype)
    cache = T["B", max_seq, kv_heads, head_dim]
    return fc.trace(lambda q, k, v, n: fc.decode_attention(q, k, v, n, scale), name="attn",
                    inputs={"q": T["B", heads, head_dim], "k": cache, "v": cache,
                            "n": fc.i32["B"]})


def make_inputs(rng, lens, heads, kv_heads, head_dim, max_seq, np_dtype):
    B = len(lens)
    q = rng.standard_normal((B, heads, head_dim)).astype(np_dtype)
    kc = rng.standard_normal((B, max_seq, kv_heads, head_dim)).astype(np_dtype)
    vc = rng.standard_normal((B, max_seq, kv_heads, head_dim)).astype(np_dtype)
    for b, n in enumerate(lens):   # poison everything past the length
        kc[b, n:] = np.nan
        vc[b, n:] = np.nan
    return {"q": q, "k": kc, "v": vc, "n": np.array(lens, np.int32)}


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("dtype,np_dtype,tol", [("f32", np.float32, 1e-4),
                                                ("f16", np.float16, 1e-2)])
def test_gqa_with_ragged_lengths(heads, kv_heads, dtype, np_dtype, tol):
    rng = np.random.default_rng()
    head_dim, max_seq = 16, 24
    lens = [0, 1, 7, 2, 24, 13]
    scale = 1 / np.sqrt(head_dim)
    ins = make_inputs(rng, lens, heads, kv_heads, head_dim, max_seq, np_dtype)
    g = attention_graph(dtype, heads, kv_heads, head_dim, max_seq, scale)
    (o,) = fc.interpret(g, ins)
    ref = attention_ref(ins["q"], ins["k"], ins["v"], lens, scale)
    assert o.dtype == np_dtype and np.all(np.isfinite(o))
    assert np.all(o[0] == 0)                                     # seq_len 0: exactly zeros
    head_kv = np.arange(heads) // (heads // kv_heads)
    np.testing.assert_allclose(o[1], ins["v"][1, 0, head_kv], rtol=1e-3)   # seq_len 1: v_0
    assert rel(o, ref) <= tol
    (op,) = fc.interpret(g, ins, precise=True)
    assert rel(op, ref) <= 1e-12


def test_seq_len_past_the_cache_is_an_input_error():
    rng = np.random.default_rng()
    ins = make_inputs(rng, [3, 4], 2, 1, 8, 4, np.float32)
    ins["n"] = np.array([3, 5], np.int32)
    with pytest.raises(InputError, match=r"seq_lens\[1\] = 5 .*0 <= seq_lens <= 4"):
        fc.interpret(attention_graph("f32", 2, 1, 8, 4, 0.3), ins)


def append_graph(kv_heads, head_dim, max_seq):
    cache = fc.f16["B", max_seq, kv_heads, head_dim]
    new = fc.f16["B", kv_heads, head_dim]
    return fc.trace(fc.kv_cache_append, name="append",
                    inputs={"k_cache": cache, "v_cache": cache, "k": new, "v": new,
                            "positions": fc.i32["B"]})


def test_kv_cache_append_writes_one_slot_per_row():
    rng = np.random.default_rng()
    B, S, Hkv, D = 3, 6, 2, 4
    kc = rng.standard_normal((B, S, Hkv, D)).astype(np.float16)
    vc = rng.standard_normal((B, S, Hkv, D)).astype(np.float16)
    kc[:, 4:] = np.nan
    k = rng.standard_normal((B, Hkv, D)).astype(np.float16)
    v = rng.standard_normal((B, Hkv, D)).astype(np.float16)
    pos = np.array([0, 5, 3], np.int32)
    k2, v2 = fc.interpret(append_graph(Hkv, D, S),
                          {"k_cache": kc, "v_cache": vc, "k": k, "v": v, "positions": pos})
    ek, ev = kc.copy(), vc.copy()
    for b in range(B):
        ek[b, pos[b]], ev[b, pos[b]] = k[b], v[b]
    np.testing.assert_array_equal(k2, ek)       # NaN stays NaN where nothing was written
    np.testing.assert_array_equal(v2, ev)
    assert np.isnan(kc[1, 5]).all()             # the input is not modified


def test_append_position_out_of_range():
    cache = np.zeros((1, 4, 1, 2), np.float16)
    new = np.ones((1, 1, 2), np.float16)
    with pytest.raises(InputError, match=r"positions\[0\] = 4"):
        fc.interpret(append_graph(1, 2, 4), {"k_cache": cache, "v_cache": cache, "k": new,
                                             "v": new, "positions": np.array([4], np.int32)})
