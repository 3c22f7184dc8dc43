"""Reference outputs of DeepSeek-V2 multi-head latent attention from Hugging Face
``transformers`` (``DeepseekV2Attention``, an implementation nobody here wrote), for fusionc's
``examples/deepseek_v2_lite.py``.

Each batch row runs as its own sequence through the HF modules in float64 (input RMSNorm →
attention with a causal mask → residual), with weights rounded to the model dtype. fusionc gets
the decode step of each row's last token: its latent cache holds, for the earlier tokens, the
normalized latent and the rotated RoPE key computed by the same HF modules (NaN past them), and
W_UK / W_UV are cut out of HF's ``kv_b_proj`` per head (``w_uk_t[h] = W_UK_hᵀ``).
"""
from __future__ import annotations

import numpy as np

from fusionc.interp.numerics import round_to
from fusionc.ir.types import DType
from tests.reference.hf import _np, _round_params


def _modules(hidden, heads, nope, rope, v_head, latent, theta, eps):
    import torch
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as m

    cfg = m.DeepseekV2Config(
        hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads,
        q_lora_rank=None, kv_lora_rank=latent, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
        v_head_dim=v_head, rms_norm_eps=eps, rope_theta=theta, attention_bias=False)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    mods = dict(attn=m.DeepseekV2Attention(cfg, layer_idx=0),
                norm=m.DeepseekV2RMSNorm(hidden, eps=eps), rot=m.DeepseekV2RotaryEmbedding(cfg))
    return {k: v.double() for k, v in mods.items()}, m.apply_rotary_emb


def mla_case(*, hidden, heads, nope, rope, v_head, latent, lens, max_seq, dtype="bf16",
             theta=10000.0, eps=1e-6, seed=0):
    """(inputs for fusionc's @attention graph of examples/deepseek_v2_lite.py, HF output
    [B, hidden] in float64)."""
    import torch

    dt = DType(dtype)
    rng = np.random.default_rng(seed)
    mods, rotate = _modules(hidden, heads, nope, rope, v_head, latent, theta, eps)
    _round_params(mods, dt, rng)
    a = mods["attn"]
    B = len(lens)
    cache = np.full((B, max_seq, latent + rope), np.nan)
    x_last, ref = np.zeros((B, hidden)), np.zeros((B, hidden))
    for b, n in enumerate(lens):
        x = torch.from_numpy(np.asarray(round_to(rng.standard_normal((1, n, hidden)), dt),
                                        np.float64))
        mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        with torch.no_grad():
            h = mods["norm"](x)
            freqs = mods["rot"](h, torch.arange(n)[None])
            out, _ = a(h, attention_mask=mask, position_embeddings=freqs)
            c, k_pe = torch.split(a.kv_a_proj_with_mqa(h), [latent, rope], dim=-1)
            c = a.kv_a_layernorm(c)
            _, k_pe = rotate(k_pe.view(1, 1, n, rope), k_pe.view(1, 1, n, rope), freqs)
        rows = np.concatenate([c[0].numpy(), k_pe[0, 0].numpy()], axis=-1)   # [n, L + R]
        cache[b, : n - 1] = rows[: n - 1]
        x_last[b] = x[0, -1].numpy()
        ref[b] = (x + out)[0, -1].numpy()
    kv_b = _np(a.kv_b_proj.weight).reshape(heads, nope + v_head, latent)
    inputs = dict(
        x=x_last, attn_norm=_np(mods["norm"].weight), w_q=_np(a.q_proj.weight),
        w_kv_a=_np(a.kv_a_proj_with_mqa.weight), kv_norm=_np(a.kv_a_layernorm.weight),
        w_uk_t=kv_b[:, :nope].transpose(0, 2, 1).copy(), w_uv=kv_b[:, nope:].copy(),
        w_o=_np(a.o_proj.weight), cache=cache,
        positions=np.array(lens, np.int32) - 1, seq_lens=np.array(lens, np.int32))
    return inputs, ref
