"""A float64 numpy Llama / Qwen3 forward pass over a whole token sequence, written from the
papers' equations independently of fusionc's graphs: RMSNorm (Zhang & Sennrich 2019, eq. 4),
RoPE with NeoX pairing (Su et al. 2021, eq. 34) and Llama 3.1 frequency scaling (Meta's
``apply_scaling``), causal softmax attention with GQA (Ainslie et al. 2023), SwiGLU MLP.
Qwen2's q, k, v biases are added where the tensors have them. Takes the Hugging Face tensor
names (random ones: ``fusionc.models.random.random_tensors``)."""
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
        q, k, v = (h @ w[f"{p}self_attn.{n}_proj.weight"].T
                   + w.get(f"{p}self_attn.{n}_proj.bias", 0.0) for n in "qkv")
        q, k, v = q.reshape(T, cfg.heads, d), k.reshape(T, cfg.kv_heads, d), \
            v.reshape(T, cfg.kv_heads, d)
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
