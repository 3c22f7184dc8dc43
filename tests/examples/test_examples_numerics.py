"""The attention blocks of the examples (small sizes) against a numpy decoder layer."""
from pathlib import Path

import numpy as np
import pytest

import fusionc as fc
from fusionc.dsl import load_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_neox(x, pos, theta):
    """Hugging Face Llama: x·cos + rotate_half(x)·sin, float64. x: [B, H, D]."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = np.concatenate([pos[:, None] * inv] * 2, axis=-1)[:, None, :]
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * np.cos(ang) + rot * np.sin(ang)


def layer_ref(ins, sz, qk_norm):
    """The attention block in float64: returns (out, k_cache, v_cache)."""
    f = {k: np.asarray(v, np.float64) for k, v in ins.items()}
    H, Hkv, D, eps, theta = sz["heads"], sz["kv_heads"], sz["head_dim"], sz["eps"], sz["theta"]
    B, pos, lens = f["x"].shape[0], ins["positions"], ins["seq_lens"]
    qkv = rms(f["x"], f["attn_norm"], eps) @ f["w_qkv"].T
    q = qkv[:, :H * D].reshape(B, H, D)
    k = qkv[:, H * D:(H + Hkv) * D].reshape(B, Hkv, D)
    v = qkv[:, (H + Hkv) * D:].reshape(B, Hkv, D)
    if qk_norm:
        q, k = rms(q, f["q_norm"], eps), rms(k, f["k_norm"], eps)
    q, k = rope_neox(q, pos, theta), rope_neox(k, pos, theta)
    kc, vc = f["k_cache"].copy(), f["v_cache"].copy()
    kc[np.arange(B), pos], vc[np.arange(B), pos] = k, v
    o = np.zeros((B, H, D))
    for b in range(B):
        for h in range(H):
            kv = h * Hkv // H
            s = kc[b, :lens[b], kv] @ q[b, h] / np.sqrt(D)
            p = np.exp(s - s.max())
            o[b, h] = p @ vc[b, :lens[b], kv] / p.sum()
    return f["x"] + o.reshape(B, H * D) @ f["w_o"].T, kc, vc


CASES = {
    "llama2_7b.py": (dict(hidden=64, heads=4, head_dim=16, intermediate=96, max_seq=12,
                          eps=1e-5, theta=10000.0), False),
    "llama3_8b.py": (dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96,
                          max_seq=12, eps=1e-5, theta=500000.0), False),
    "qwen3_qk_norm.py": (dict(hidden=48, heads=4, kv_heads=1, head_dim=16, intermediate=64,
                              max_seq=12, eps=1e-6, theta=1e6), True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_block(name):
    sizes, qk_norm = CASES[name]
    m = load_file(EXAMPLES / name, dtype="f32", **sizes)
    sz = {"kv_heads": sizes["heads"], **sizes}
    rng = np.random.default_rng()
    lens = np.array([1, 5, 12, 3], np.int32)
    ins = {p.name: rng.standard_normal(p.type.concrete({"B": 4})).astype(np.float32) * 0.3
           for p in m["attention"].params if p.type.dtype.is_float}
    for b, n in enumerate(lens):                  # past the new token: never read
        ins["k_cache"][b, n:] = np.nan
        ins["v_cache"][b, n:] = np.nan
    ins |= {"positions": lens - 1, "seq_lens": lens}
    ref = layer_ref(ins, sz, qk_norm)
    out = fc.interpret(m, ins, graph="attention")
    for got, want in zip(out, ref):
        assert rel(np.nan_to_num(got), np.nan_to_num(want)) <= 1e-4
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    for got, want in zip(fc.interpret(m, ins, graph="attention", precise=True), ref):
        assert rel(np.nan_to_num(got), np.nan_to_num(want)) <= 1e-12
