"""Tensor-parallel sharding of one decoder layer's weights and KV cache (Megatron-LM, Shoeybi
et al. 2019, §3): the inputs of rank r's ``@layer`` graph
(:func:`fusionc.models.blocks.tp_layer_block`) from the full single-GPU inputs of the
``@attention`` and ``@mlp`` graphs (:func:`fusionc.models.blocks.attention_block`,
:func:`~fusionc.models.blocks.mlp_block`)."""
from __future__ import annotations

import numpy as np


def shard_layer(attn: dict, mlp: dict, rank: int, tp: int, *, heads: int, kv_heads: int,
                head_dim: int, intermediate: int) -> dict:
    """Rank ``rank``'s inputs of the TP layer graph.

    Args:
        attn: inputs of ``@attention`` (x, attn_norm, w_qkv ``[(heads + 2·kv_heads)·head_dim,
            hidden]``, w_o ``[hidden, heads·head_dim]``, k_cache/v_cache ``[B, S, kv_heads,
            head_dim]``, positions, seq_lens); mlp: of ``@mlp`` (mlp_norm, w_gate_up
            ``[2·intermediate, hidden]``, w_down ``[hidden, intermediate]``).
    Returns:
        ``{param: array}``: rank r's query heads ``[r·heads/tp, (r+1)·heads/tp)`` and KV heads,
        its slice of the intermediate rows; x, norms, positions and lengths replicated.
    Raises:
        ValueError: rank outside 0..tp-1, or heads, kv_heads or intermediate not divisible
            by tp.
    """
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} of tp = {tp}")
    for name, n in (("heads", heads), ("kv_heads", kv_heads), ("intermediate", intermediate)):
        if n % tp:
            raise ValueError(f"{name} = {n} is not a multiple of tp = {tp}")
    hq, hkv, ish, d = heads // tp, kv_heads // tp, intermediate // tp, head_dim
    q0, k0 = heads * d, (heads + kv_heads) * d
    w = attn["w_qkv"]
    qkv = np.concatenate([w[rank * hq * d:(rank + 1) * hq * d],
                          w[q0 + rank * hkv * d:q0 + (rank + 1) * hkv * d],
                          w[k0 + rank * hkv * d:k0 + (rank + 1) * hkv * d]])
    gu = mlp["w_gate_up"]
    kv = slice(rank * hkv, (rank + 1) * hkv)
    return {
        "x": attn["x"], "attn_norm": attn["attn_norm"], "w_qkv": np.ascontiguousarray(qkv),
        "w_o": np.ascontiguousarray(attn["w_o"][:, rank * hq * d:(rank + 1) * hq * d]),
        "k_cache": np.ascontiguousarray(attn["k_cache"][:, :, kv]),
        "v_cache": np.ascontiguousarray(attn["v_cache"][:, :, kv]),
        "positions": attn["positions"], "seq_lens": attn["seq_lens"],
        "mlp_norm": mlp["mlp_norm"],
        "w_gate_up": np.ascontiguousarray(np.concatenate(
            [gu[rank * ish:(rank + 1) * ish], gu[intermediate + rank * ish:
                                                 intermediate + (rank + 1) * ish]])),
        "w_down": np.ascontiguousarray(mlp["w_down"][:, rank * ish:(rank + 1) * ish]),
    }
