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
