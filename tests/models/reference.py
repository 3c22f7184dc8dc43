"""A float64 numpy Llama / Qwen3 forward pass over a whole token sequence, written from the
papers' equations independently of fusionc's graphs: RMSNorm (Zhang & Sennrich 2019, eq. 4),
RoPE with NeoX pairing (Su et al. 2021, eq. 34) and Llama 3.1 frequency scaling (Meta's
``apply_scaling``), causal softmax attention with GQA (Ainslie et al. 2023), SwiGLU MLP.
Takes the Hugging Face tensor names."""
import math

import numpy as np


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def llama31_freqs(freqs, factor, low, high, old):
    out = []
    for f in freqs:  # the three bands of Meta's apply_scaling, written as branches
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            s = (old / wavelen - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return np.array(out)


def rope(x, theta, scaling):
    """x [T, heads, d] rotated by position t (NeoX halves)."""
    d = x.shape[-1]
    freqs = theta ** (-np.arange(0, d, 2) / d)
    if scaling:
        freqs = llama31_freqs(freqs, *scaling)
    ang = np.arange(x.shape[0])[:, None] * freqs[None, :]             # [T, d/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def forward(t: dict, cfg, tokens) -> np.ndarray:
    """Logits [T, vocab] (float64) of every position of ``tokens`` (causal)."""
    w = {k: np.asarray(v, np.float64) for k, v in t.items()}
    T, d = len(tokens), cfg.head_dim
    x = w["model.embed_tokens.weight"][tokens]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"], cfg.eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, cfg.heads, d)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, cfg.kv_heads, d)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, cfg.kv_heads, d)
        if cfg.qk_norm:
            q = rms(q, w[p + "self_attn.q_norm.weight"], cfg.eps)
            k = rms(k, w[p + "self_attn.k_norm.weight"], cfg.eps)
        q, k = rope(q, cfg.theta, cfg.rope_scaling), rope(k, cfg.theta, cfg.rope_scaling)
        g = cfg.heads // cfg.kv_heads
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(d) + mask
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(T, cfg.heads * d)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"], cfg.eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"], cfg.eps)
    head = w["model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"]
    return x @ head.T


def random_tensors(cfg, rng, np_dtype=np.float16) -> dict:
    """Hugging Face-named random weights of ``cfg`` (norm weights near 1)."""
    h, d, i = cfg.hidden, cfg.head_dim, cfg.intermediate
    shapes = {"model.embed_tokens.weight": (cfg.vocab, h), "model.norm.weight": (h,)}
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab, h)
    for n in range(cfg.layers):
        p = f"model.layers.{n}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (cfg.heads * d, h),
                   p + "self_attn.k_proj.weight": (cfg.kv_heads * d, h),
                   p + "self_attn.v_proj.weight": (cfg.kv_heads * d, h),
                   p + "self_attn.o_proj.weight": (h, cfg.heads * d),
                   p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                   p + "mlp.down_proj.weight": (h, i)}
        if cfg.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
    return {k: ((1 + 0.1 * rng.standard_normal(s)) if len(s) == 1 else
                0.1 * rng.standard_normal(s)).astype(np_dtype) for k, s in shapes.items()}
