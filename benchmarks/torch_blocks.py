"""PyTorch baselines of the decoder blocks, written from the same formulas as fusionc's ops
(Llama: RMSNorm with fp32 accumulation, fused QKV, NeoX RoPE, GQA decode attention over a
[batch, max_seq, kv_heads, head_dim] cache, output projection, residual; SwiGLU MLP)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps):
    xf = x.float()
    return (w.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def rope(x, positions, theta, scaling=()):
    """NeoX (half split) RoPE over the whole head: x [B, H, D], positions [B]; ``scaling``:
    Llama 3.1's frequency scaling ``(factor, low_freq_factor, high_freq_factor,
    original_max_position)`` as transformers' ``_compute_llama3_parameters``, or ()."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    if scaling:
        factor, low, high, old = scaling
        wavelen = 2 * torch.pi / inv
        smooth = ((old / wavelen - low) / (high - low)).clamp(0, 1)
        inv = (1 - smooth) * inv / factor + smooth * inv
    ang = positions.float()[:, None, None] * inv  # [B, 1, D/2]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


def _heads(x, attn_norm, w_qkv, positions, heads, kv_heads, head_dim, eps, theta,
           q_norm=None, k_norm=None, scaling=()):
    """RMSNorm, the fused QKV projection, (QK-norm over head_dim: Qwen3), RoPE on q and k:
    q [B, H, D], k [B, KV, D], v flat."""
    B = x.shape[0]
    q, k, v = (rms_norm(x, attn_norm, eps) @ w_qkv.t()).split(
        [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
    q, k = q.view(B, heads, head_dim), k.view(B, kv_heads, head_dim)
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    return rope(q, positions, theta, scaling), rope(k, positions, theta, scaling), v


def attention_block(x, attn_norm, w_qkv, w_o, k_cache, v_cache, positions, seq_len: int, *,
                    heads, kv_heads, head_dim, eps, theta, q_norm=None, k_norm=None):
    """One decode step; every row attends over ``seq_len`` tokens (the new one last)."""
    B = x.shape[0]
    q, k, v = _heads(x, attn_norm, w_qkv, positions, heads, kv_heads, head_dim, eps, theta,
                     q_norm, k_norm)
    rows = torch.arange(B, device=x.device)
    k_cache[rows, positions] = k
    v_cache[rows, positions.long()] = v.view(B, kv_heads, head_dim)
    kk = k_cache[:, :seq_len].transpose(1, 2)  # [B, Hkv, S, D]
    vv = v_cache[:, :seq_len].transpose(1, 2)
    o = F.scaled_dot_product_attention(q.unsqueeze(2), kk, vv, enable_gqa=heads != kv_heads)
    return x + o.reshape(B, heads * head_dim) @ w_o.t()


def attention_block_hf(x, attn_norm, w_qkv, w_o, k_hf, v_hf, positions, seq_len: int, *,
                       heads, kv_heads, head_dim, eps, theta, form="sdpa", q_norm=None,
                       k_norm=None, scaling=()):
    """:func:`attention_block` over caches in the layout of transformers, contiguous
    ``[B, kv_heads, max_seq, head_dim]``, where SDPA keeps its fast paths (``scaling``: as
    :func:`rope`). ``form``: ``"sdpa"``
    (``F.scaled_dot_product_attention`` with GQA) or ``"matmul"`` (the query heads of a KV head
    as one matrix: q·Kᵀ, fp32 softmax, P·V, as HF's eager attention without the K/V repeat)."""
    B = x.shape[0]
    q, k, v = _heads(x, attn_norm, w_qkv, positions, heads, kv_heads, head_dim, eps, theta,
                     q_norm, k_norm, scaling)
    rows, pos = torch.arange(B, device=x.device), positions.long()
    k_hf[rows, :, pos] = k
    v_hf[rows, :, pos] = v.view(B, kv_heads, head_dim)
    kk, vv = k_hf[:, :, :seq_len], v_hf[:, :, :seq_len]
    if form == "sdpa":
        o = F.scaled_dot_product_attention(q.unsqueeze(2), kk, vv, enable_gqa=heads != kv_heads)
    else:
        qg = q.view(B, kv_heads, heads // kv_heads, head_dim)
        s = (qg @ kk.transpose(-1, -2)).float() * head_dim ** -0.5
        o = s.softmax(-1).to(x.dtype) @ vv
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
    ``seq_len`` tokens (the new one last). ``w_q``: the query weight, or (w_q_a, q_a_norm,
    w_q_b) for DeepSeek-V3's compressed query (eqs. 12-13)."""
    B = x.shape[0]
    h = rms_norm(x, attn_norm, eps)
    if isinstance(w_q, tuple):
        w_q_a, q_a_norm, w_q = w_q
        q = (rms_norm(h @ w_q_a.t(), q_a_norm, eps) @ w_q.t()).view(B, heads, nope + rope)
    else:
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


def prefill_attention_block(x, attn_norm, w_qkv, w_o, k_hf, v_hf, *, heads, kv_heads,
                            head_dim, eps, theta, scaling=(), q_norm=None, k_norm=None):
    """The attention block over a whole prompt of one sequence: x ``[T, hidden]`` at positions
    0..T-1, K and V copied into the cache ``[1, kv_heads, max_seq, head_dim]`` (transformers'
    layout), causal SDPA (FlashAttention when it applies) with GQA."""
    t = x.shape[0]
    pos = torch.arange(t, device=x.device)
    q, k, v = _heads(x, attn_norm, w_qkv, pos, heads, kv_heads, head_dim, eps, theta,
                     q_norm, k_norm, scaling)
    k_hf[0, :, :t] = k.transpose(0, 1)
    v_hf[0, :, :t] = v.view(t, kv_heads, head_dim).transpose(0, 1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k_hf[:, :, :t], v_hf[:, :, :t],
                                       is_causal=True, enable_gqa=heads != kv_heads)
    return x + o[0].transpose(0, 1).reshape(t, heads * head_dim) @ w_o.t()
