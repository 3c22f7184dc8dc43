"""Float64 reference of one MLA decode step written from DeepSeek-V2's equations in the
*non-absorbed* form (arXiv 2405.04434, §2.1.2-2.1.3, eqs. 9-19; q_lora_rank = 0 as in
DeepSeek-V2-Lite, or the compressed query of DeepSeek-V3: :func:`query`): per head the key is [W_UK_h c_KV ; k_R] and the value W_UV_h c_KV; keys,
values and queries are materialized, then softmax attention and the output projection.

The cache holds, for t < seq_len, rows [c_KV,t ; k_R,t] (already normalized and rotated); the
token at ``position`` is appended in this step from x. RoPE pairs interleaved elements
(x[2i], x[2i+1]) rotated by position · theta^(−2i/d) (DeepSeek's complex-number form).
"""
from __future__ import annotations

import numpy as np


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def rope_interleaved(x, pos, theta):
    d = x.shape[-1]
    ang = pos * theta ** (-np.arange(0, d, 2) / d)
    c, s = np.cos(ang), np.sin(ang)
    out = x.copy()
    out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    out[..., 1::2] = x[..., 1::2] * c + x[..., 0::2] * s
    return out


def query(w: dict, h, eps):
    """The query rows of h: ``w_q · h``, or with query compression (DeepSeek-V3, q_lora_rank
    > 0; arXiv 2405.04434 eqs. 12-13) ``w_q_b · rms_norm(w_q_a · h, q_a_norm)``."""
    if "w_q_a" in w:
        return w["w_q_b"] @ rms_norm(w["w_q_a"] @ h, w["q_a_norm"], eps)
    return w["w_q"] @ h


def mla_step(w: dict, x, cache, position: int, seq_len: int, *, heads, nope, rope, latent,
             eps, theta):
    """One row. w: the block's weights (examples/deepseek_v2_lite.py names) in float64; x
    [hidden]; cache [max_seq, latent + rope]. Returns (out [hidden], new cache row
    [latent + rope]); the row is written at ``position`` and tokens t < seq_len attend."""
    h = rms_norm(x, w["attn_norm"], eps)
    kv_a = w["w_kv_a"] @ h
    c = rms_norm(kv_a[:latent], w["kv_norm"], eps)
    k_r = rope_interleaved(kv_a[latent:], position, theta)
    rows = np.array(cache[:seq_len], np.float64)
    new = np.concatenate([c, k_r])
    if 0 <= position < seq_len:
        rows[position] = new
    q = query(w, h, eps).reshape(heads, nope + rope)
    q_r = rope_interleaved(q[:, nope:], position, theta)
    scale = 1 / np.sqrt(nope + rope)
    o = []
    for i in range(heads):
        w_uk, w_uv = w["w_uk_t"][i].T, w["w_uv"][i]         # W_UK_h [nope, L], W_UV_h [v, L]
        keys = np.concatenate([rows[:, :latent] @ w_uk.T, rows[:, latent:]], axis=1)
        values = rows[:, :latent] @ w_uv.T                   # [T, v_head]
        if seq_len == 0:
            o.append(np.zeros(w_uv.shape[0]))
            continue
        s = keys @ np.concatenate([q[i, :nope], q_r[i]]) * scale
        p = np.exp(s - s.max())
        o.append(p @ values / p.sum())
    return x + w["w_o"] @ np.concatenate(o), new
