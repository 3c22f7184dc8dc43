"""PyTorch baselines of the decoder blocks, written from the same formulas as fusionc's ops
(Llama: RMSNorm with fp32 accumulation, fused QKV, NeoX RoPE, GQA decode attention over a
[batch, max_seq, kv_heads, head_dim] cache, output projection, residual; SwiGLU MLP)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps):
    xf = x.float()
    return (w.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def rope(x, positions, theta):
    """NeoX (half split) RoPE over the whole head: x [B, H, D], positions [B]."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = positions.float()[:, None, None] * inv  # [B, 1, D/2]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


def attention_block(x, attn_norm, w_qkv, w_o, k_cache, v_cache, positions, seq_len: int, *,
                    heads, kv_heads, head_dim, eps, theta):
    """One decode step; every row attends over ``seq_len`` tokens (the new one last)."""
    B = x.shape[0]
    h = rms_norm(x, attn_norm, eps)
    q, k, v = (h @ w_qkv.t()).split([heads * head_dim, kv_heads * head_dim,
                                     kv_heads * head_dim], -1)
    q = rope(q.view(B, heads, head_dim), positions, theta)
    k = rope(k.view(B, kv_heads, head_dim), positions, theta)
    rows = torch.arange(B, device=x.device)
    k_cache[rows, positions] = k
    v_cache[rows, positions.long()] = v.view(B, kv_heads, head_dim)
    kk = k_cache[:, :seq_len].transpose(1, 2)  # [B, Hkv, S, D]
    vv = v_cache[:, :seq_len].transpose(1, 2)
    o = F.scaled_dot_product_attention(q.unsqueeze(2), kk, vv, enable_gqa=heads != kv_heads)
    return x + o.reshape(B, heads * head_dim) @ w_o.t()


def mlp_block(x, mlp_norm, w_gate_up, w_down, *, eps):
    h = rms_norm(x, mlp_norm, eps)
    gate, up = (h @ w_gate_up.t()).chunk(2, -1)
    return x + (F.silu(gate) * up) @ w_down.t()


def rope_interleaved(x, positions, theta):
    """GPT-J / DeepSeek RoPE: pairs (x[2i], x[2i+1]); x [B, H, D], positions [B]."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = positions.float()[:, None, None] * inv
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2).to(x.dtype)


def mla_block(x, attn_norm, w_q, w_kv_a, kv_norm, w_uk_t, w_uv, w_o, cache, positions,
              seq_len: int, *, heads, nope, rope, latent, eps, theta):
    """DeepSeek-V2 MLA decode step in the weight-absorbed form (the paper's appendix C, as
    FlashMLA-based engines run it): cache [B, max_seq, latent + rope]; every row attends over
    ``seq_len`` tokens (the new one last)."""
    B = x.shape[0]
    h = rms_norm(x, attn_norm, eps)
    q = (h @ w_q.t()).view(B, heads, nope + rope)
    q_nope, q_pe = q.split([nope, rope], -1)
    q_pe = rope_interleaved(q_pe, positions, theta)
    c, k_pe = (h @ w_kv_a.t()).split([latent, rope], -1)
    c = rms_norm(c, kv_norm, eps)
    k_pe = rope_interleaved(k_pe.view(B, 1, rope), positions, theta).view(B, rope)
    cache[torch.arange(B, device=x.device), positions.long()] = torch.cat([c, k_pe], -1)
    q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk_t.transpose(1, 2)).transpose(0, 1)
    qf = torch.cat([q_lat, q_pe], -1)                                   # [B, H, L + R]
    kv = cache[:, :seq_len]                                             # [B, S, L + R]
    s = torch.bmm(qf, kv.transpose(1, 2)).float() * (nope + rope) ** -0.5
    p = s.softmax(-1).to(x.dtype)
    o_lat = torch.bmm(p, kv[..., :latent])                              # [B, H, L]
    o = torch.bmm(o_lat.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)
    return x + o.reshape(B, -1) @ w_o.t()
