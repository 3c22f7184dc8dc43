"""Tensor-parallel sharding of a decoder's layers (Megatron-LM, Shoeybi et al. 2019, §3): rank
r of ``tp`` holds the column-parallel rows of QKV (its ``heads/tp`` query heads and
``kv_heads/tp`` KV heads) and of gate/up (``intermediate/tp`` rows each), the row-parallel
columns of O and down, and the norms whole; the layer graph of every rank is
:func:`fusionc.models.blocks.tp_layer_block`, whose two all-reduces add the ranks' partial sums
of O and down. The embedding, final norm and LM head stay replicated.

- :func:`shard_weights` / :func:`shard_layer`: rank r's arrays from a whole layer's;
- :func:`layer_shard`: rank r's arrays read straight from a safetensors checkpoint (only its
  rows and columns are read);
- :func:`check_tp`: which models and sizes shard.
"""
from __future__ import annotations

import numbers

import numpy as np

from fusionc.errors import InputError


def check_tp(cfg, tp) -> None:
    """InputError unless model ``cfg`` shards over ``tp`` ranks: tp a positive integer that
    divides heads, kv_heads and intermediate, and a Llama-family layer (the TP layer graph has
    no QK-norm or QKV bias yet)."""
    if isinstance(tp, bool) or not isinstance(tp, numbers.Integral) or tp < 1:
        raise InputError(f"tp = {tp!r}", valid="a positive number of ranks")
    for name in ("heads", "kv_heads", "intermediate"):
        n = getattr(cfg, name)
        if n % tp:
            ok = [d for d in range(1, min(cfg.heads, cfg.kv_heads) + 1)
                  if cfg.heads % d == 0 and cfg.kv_heads % d == 0 and cfg.intermediate % d == 0]
            raise InputError(f"tp = {tp} ranks for {name} = {n}",
                             valid=f"a tp that divides heads, kv_heads and intermediate: "
                                   f"{', '.join(map(str, ok))}")
    if tp > 1 and (cfg.qk_norm or cfg.qkv_bias):
        what = "QK-norm (Qwen3)" if cfg.qk_norm else "a QKV bias (Qwen2)"
        raise InputError(f"tp = {tp} for a {cfg.arch} model with {what}",
                         valid="tp = 1, or a Llama-family model (the tensor-parallel layer "
                               "graph has no QK-norm or QKV bias yet)")


def _bounds(rank: int, tp: int, heads: int, kv_heads: int, head_dim: int, intermediate: int):
    """Rank r's (q rows, k rows, v rows, gate rows, up rows, o/down columns) of a layer;
    InputError for a rank outside 0..tp-1 or sizes tp does not divide."""
    for what, v in (("tp", tp), ("rank", rank)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise InputError(f"{what} = {v!r}", valid="an integer")
    if not 0 <= rank < tp:
        raise InputError(f"rank {rank} of tp = {tp}", valid=f"0 <= rank < {tp}")
    for name, n in (("heads", heads), ("kv_heads", kv_heads), ("intermediate", intermediate)):
        if n % tp:
            raise InputError(f"{name} = {n} is not a multiple of tp = {tp}",
                             valid=f"a tp that divides {name}")
    rank, tp = int(rank), int(tp)
    hq, hkv, ish, d = heads // tp, kv_heads // tp, intermediate // tp, head_dim
    q0, k0 = heads * d, (heads + kv_heads) * d
    return dict(q=slice(rank * hq * d, (rank + 1) * hq * d),
                k=slice(q0 + rank * hkv * d, q0 + (rank + 1) * hkv * d),
                v=slice(k0 + rank * hkv * d, k0 + (rank + 1) * hkv * d),
                gate=slice(rank * ish, (rank + 1) * ish),
                up=slice(intermediate + rank * ish, intermediate + (rank + 1) * ish),
                o=slice(rank * hq * d, (rank + 1) * hq * d),
                down=slice(rank * ish, (rank + 1) * ish),
                kv=slice(rank * hkv, (rank + 1) * hkv))


def shard_weights(w: dict, rank: int, tp: int, *, heads: int, kv_heads: int, head_dim: int,
                  intermediate: int) -> dict:
    """Rank ``rank``'s weights of the TP layer graph from a whole layer's
    (:func:`fusionc.models.weights.layer_weights`: ``w_qkv`` [(heads + 2·kv_heads)·head_dim,
    hidden], ``w_o`` [hidden, heads·head_dim], ``w_gate_up`` [2·intermediate, hidden],
    ``w_down`` [hidden, intermediate], the norms ``attn_norm`` and ``mlp_norm``).

    Raises:
        InputError: rank outside 0..tp-1, heads, kv_heads or intermediate not divisible by
            tp, or a weight whose shape is not the whole layer's for these sizes.
    """
    b = _bounds(rank, tp, heads, kv_heads, head_dim, intermediate)
    hidden = w["w_qkv"].shape[-1]
    want = {"w_qkv": ((heads + 2 * kv_heads) * head_dim, hidden),
            "w_o": (hidden, heads * head_dim), "w_gate_up": (2 * intermediate, hidden),
            "w_down": (hidden, intermediate)}
    for k, shape in want.items():
        if tuple(w[k].shape) != shape:
            raise InputError(f"whole-layer {k} of shape {list(w[k].shape)}",
                             valid=f"{list(shape)} for heads = {heads}, kv_heads = {kv_heads}, "
                                   f"head_dim = {head_dim}, intermediate = {intermediate}")
    xp = _xp(w["w_qkv"])
    qkv, gu = w["w_qkv"], w["w_gate_up"]
    return {"attn_norm": w["attn_norm"], "mlp_norm": w["mlp_norm"],
            "w_qkv": xp.ascontiguousarray(xp.concatenate([qkv[b["q"]], qkv[b["k"]],
                                                          qkv[b["v"]]])),
            "w_o": xp.ascontiguousarray(w["w_o"][:, b["o"]]),
            "w_gate_up": xp.ascontiguousarray(xp.concatenate([gu[b["gate"]], gu[b["up"]]])),
            "w_down": xp.ascontiguousarray(w["w_down"][:, b["down"]])}


def shard_layer(attn: dict, mlp: dict, rank: int, tp: int, *, heads: int, kv_heads: int,
                head_dim: int, intermediate: int) -> dict:
    """Rank ``rank``'s inputs of the TP layer graph from the full single-GPU inputs of the
    ``@attention`` and ``@mlp`` graphs (weights as :func:`shard_weights`; k_cache/v_cache
    ``[B, S, kv_heads, head_dim]`` cut to the rank's KV heads; x, positions and lengths
    replicated). Raises InputError as :func:`shard_weights`."""
    sizes = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate)
    w = dict(attn_norm=attn["attn_norm"], w_qkv=attn["w_qkv"], w_o=attn["w_o"],
             mlp_norm=mlp["mlp_norm"], w_gate_up=mlp["w_gate_up"], w_down=mlp["w_down"])
    kv = _bounds(rank, tp, **sizes)["kv"]
    return shard_weights(w, rank, tp, **sizes) | {
        "x": attn["x"], "positions": attn["positions"], "seq_lens": attn["seq_lens"],
        "k_cache": np.ascontiguousarray(attn["k_cache"][:, :, kv]),
        "v_cache": np.ascontiguousarray(attn["v_cache"][:, :, kv])}


def layer_shard(src, cfg, i: int, rank: int, tp: int, dtype: str | None = None) -> dict:
    """Rank ``rank``'s weights of layer ``i`` read from checkpoint ``src``
    (:class:`fusionc.models.weights.SafetensorsWeights`): only the rank's rows of q, k, v,
    gate and up and its columns of o and down. Equal to ``shard_weights(layer_weights(...))``.
    Raises InputError as :func:`check_tp` and for missing or ill-shaped tensors."""
    check_tp(cfg, tp)
    dt = dtype or cfg.dtype
    h, d, inter = cfg.hidden, cfg.head_dim, cfg.intermediate
    q, kv = cfg.heads * d, cfg.kv_heads * d
    b = _bounds(rank, tp, cfg.heads, cfg.kv_heads, d, inter)
    p = f"model.layers.{i}."

    def rows(name, shape, part):   # rows of a projection (HF weights are [out, in])
        return src.get(p + name + ".weight", shape, dt, index=part)

    def shift(s: slice, by: int) -> slice:
        return slice(s.start - by, s.stop - by)
    return {
        "attn_norm": src.get(p + "input_layernorm.weight", (h,), dt),
        "w_qkv": np.concatenate([rows("self_attn.q_proj", (q, h), b["q"]),
                                 rows("self_attn.k_proj", (kv, h), shift(b["k"], q)),
                                 rows("self_attn.v_proj", (kv, h), shift(b["v"], q + kv))]),
        "w_o": rows("self_attn.o_proj", (h, q), (slice(None), b["o"])),
        "mlp_norm": src.get(p + "post_attention_layernorm.weight", (h,), dt),
        "w_gate_up": np.concatenate([rows("mlp.gate_proj", (inter, h), b["gate"]),
                                     rows("mlp.up_proj", (inter, h), shift(b["up"], inter))]),
        "w_down": rows("mlp.down_proj", (h, inter), (slice(None), b["down"])),
    }


def _xp(a):
    """numpy, or cupy for a CuPy array."""
    return np if isinstance(a, np.ndarray) else __import__("cupy")
