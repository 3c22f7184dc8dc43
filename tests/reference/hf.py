"""Reference outputs from Hugging Face ``transformers`` (an implementation nobody here wrote).

Each case builds a small random Llama or Qwen3 layer in float64 with weights rounded to the
model dtype, runs every batch row as its own sequence through the HF modules (input RMSNorm →
attention with a causal mask → residual; or post-attention RMSNorm → MLP → residual), and returns
fusionc inputs for the decode step of each row's last token (its KV cache filled with the HF key
and value states of the earlier tokens, NaN past them) with the HF output of that token.
"""

from __future__ import annotations

import numpy as np

from fusionc.interp.numerics import round_to
from fusionc.ir.types import DType


def _modules(family: str, hidden, heads, kv_heads, head_dim, inter, theta, eps):
    import torch

    if family == "qwen3":
        from transformers import Qwen3Config as Config
        from transformers.models.qwen3 import modeling_qwen3 as m

        pre = "Qwen3"
    else:
        from transformers import LlamaConfig as Config
        from transformers.models.llama import modeling_llama as m

        pre = "Llama"
    cfg = Config(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        rms_norm_eps=eps,
        rope_theta=theta,
        attention_bias=False,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    mods = dict(
        attn=getattr(m, f"{pre}Attention")(cfg, layer_idx=0),
        mlp=getattr(m, f"{pre}MLP")(cfg),
        norm=getattr(m, f"{pre}RMSNorm")(hidden, eps=eps),
        rot=getattr(m, f"{pre}RotaryEmbedding")(cfg),
    )
    return {k: v.double() for k, v in mods.items()}


def _round_params(mods, dtype: DType, rng) -> None:
    """Random weights (scaled by 1/sqrt(fan-in); norms near 1), rounded to the model dtype."""
    import torch

    for mod in mods.values():   # the rotary embedding has no parameters
        for _, p in mod.named_parameters():
            a = rng.standard_normal(tuple(p.shape))
            a = 1 + 0.2 * a if p.ndim == 1 else a / np.sqrt(p.shape[1])
            with torch.no_grad():
                p.copy_(torch.from_numpy(np.asarray(round_to(a, dtype), np.float64)))


def attention_case(
    family: str,
    *,
    hidden,
    heads,
    kv_heads,
    head_dim,
    lens,
    max_seq,
    dtype="f16",
    theta=10000.0,
    eps=1e-5,
    seed=0,
):
    """(inputs for fusionc's @attention graph, HF output [B, hidden] in float64)."""
    import torch

    dt = DType(dtype)
    rng = np.random.default_rng(seed)
    mods = _modules(family, hidden, heads, kv_heads, head_dim, 64, theta, eps)
    _round_params(mods, dt, rng)
    B = len(lens)
    kc = np.full((B, max_seq, kv_heads, head_dim), np.nan, np.float32)
    vc = kc.copy()
    x_last, ref = np.zeros((B, hidden)), np.zeros((B, hidden))
    for b, n in enumerate(lens):
        x = torch.from_numpy(
            np.asarray(round_to(rng.standard_normal((1, n, hidden)), dt), np.float64)
        )
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache()
        pos = torch.arange(n)[None]
        mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        with torch.no_grad():
            h = mods["norm"](x)
            out, _ = mods["attn"](h, mods["rot"](h, pos), mask, past_key_values=cache)
        keys = cache.layers[0].keys[0].transpose(0, 1).numpy()  # [n, Hkv, D]
        vals = cache.layers[0].values[0].transpose(0, 1).numpy()
        kc[b, : n - 1], vc[b, : n - 1] = keys[: n - 1], vals[: n - 1]
        x_last[b] = x[0, -1].numpy()
        ref[b] = (x + out)[0, -1].numpy()
    a = mods["attn"]
    inputs = dict(
        x=x_last,
        attn_norm=_np(mods["norm"].weight),
        w_qkv=np.concatenate([_np(a.q_proj.weight), _np(a.k_proj.weight), _np(a.v_proj.weight)]),
        w_o=_np(a.o_proj.weight),
        k_cache=kc,
        v_cache=vc,
        positions=np.array(lens, np.int32) - 1,
        seq_lens=np.array(lens, np.int32),
    )
    if family == "qwen3":
        inputs.update(q_norm=_np(a.q_norm.weight), k_norm=_np(a.k_norm.weight))
    return inputs, ref


def mlp_case(family: str, *, hidden, inter, batch, dtype="f16", eps=1e-5, seed=0):
    """(inputs for fusionc's @mlp graph, HF output [B, hidden] in float64)."""
    import torch

    dt = DType(dtype)
    rng = np.random.default_rng(seed)
    mods = _modules(family, hidden, 1, 1, hidden, inter, 10000.0, eps)
    _round_params(mods, dt, rng)
    x = torch.from_numpy(np.asarray(round_to(rng.standard_normal((batch, hidden)), dt), np.float64))
    with torch.no_grad():
        ref = (x + mods["mlp"](mods["norm"](x))).numpy()
    m = mods["mlp"]
    inputs = dict(
        x=x.numpy(),
        mlp_norm=_np(mods["norm"].weight),
        w_gate_up=np.concatenate([_np(m.gate_proj.weight), _np(m.up_proj.weight)]),
        w_down=_np(m.down_proj.weight),
    )
    return inputs, ref


def _np(t) -> np.ndarray:
    return t.detach().numpy()
