"""Small random models written as Hugging Face folders (``config.json`` + ``*.safetensors``), to
try ``fusionc generate`` and the model front without downloading a checkpoint:

    from fusionc.models.random import write_random_model
    write_random_model("/tmp/tiny", kind="qwen3")        # or "llama", "qwen2"

or ``fusionc random-model /tmp/tiny --kind qwen3``. The weights are random (projections
N(0, 0.1²), norm weights near 1), so the generated tokens mean nothing; the sizes are tiny (a
hidden size of 48–64, 2 layers, 32 positions) unless overridden.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fusionc.errors import InputError
from fusionc.models.config import config_from_dict

_ROPE31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
TINY = {   # config.json of each kind (transformers' field names)
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                  num_hidden_layers=2, vocab_size=97, rms_norm_eps=1e-5, rope_theta=500000.0,
                  rope_scaling=_ROPE31, tie_word_embeddings=True, max_position_embeddings=32,
                  torch_dtype="float16"),
    "qwen2": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=64,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=112,
                  num_hidden_layers=2, vocab_size=89, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=True, max_position_embeddings=32, torch_dtype="bfloat16",
                  use_sliding_window=False),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=48,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  intermediate_size=80, num_hidden_layers=2, vocab_size=101, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, tie_word_embeddings=False, max_position_embeddings=32,
                  torch_dtype="bfloat16"),
}


def write_random_model(path: str | Path, kind: str = "qwen3", *, seed: int = 0,
                       shards: int = 1, **config) -> dict:
    """Write a tiny random model of ``kind`` (``llama``, ``qwen2``, ``qwen3``) into folder
    ``path`` (created if needed) and return its tensors by Hugging Face name.

    Args:
        kind: the architecture; its config is :data:`TINY` ``[kind]``.
        seed: the weights' random seed.
        shards: safetensors files (an index file when > 1).
        **config: config.json fields that replace the tiny defaults, e.g.
            ``num_hidden_layers=4, torch_dtype="float32", tie_word_embeddings=False``
            (``dtype=`` is taken as ``torch_dtype``).
    Raises:
        InputError: an unknown kind, or fields that make an invalid config.
    """
    if kind not in TINY:
        raise InputError(f"random model kind {kind!r}", valid=", ".join(TINY))
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create {folder}: {e.strerror}", valid="a writable folder"
                         ) from None
    raw = TINY[kind] | config
    if "dtype" in config:       # transformers' newer name for torch_dtype: the one given wins
        raw["torch_dtype"] = raw.pop("dtype")
    return write_model(folder, raw, np.random.default_rng(seed), shards)


def write_model(path: Path, raw: dict, rng, shards: int = 1) -> dict:
    """``raw`` as ``path/config.json`` and random weights of that config as safetensors
    (``shards`` files with a ``model.safetensors.index.json`` when > 1); returns the tensors."""
    import ml_dtypes
    from safetensors.numpy import save_file
    cfg = config_from_dict(raw)
    np_dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[cfg.dtype]
    tensors = random_tensors(cfg, rng, np_dtype)
    path = Path(path)
    (path / "config.json").write_text(json.dumps(raw, indent=1))
    if shards == 1:
        save_file(tensors, path / "model.safetensors")
        return tensors
    names, wmap = sorted(tensors), {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        save_file({k: tensors[k] for k in part}, path / fname)
        wmap |= {k: fname for k in part}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    return tensors


def random_tensors(cfg, rng, np_dtype=np.float16) -> dict:
    """Hugging Face-named random weights of ``cfg`` (:class:`~fusionc.models.ModelConfig`):
    projections and biases N(0, 0.1²), norm weights N(1, 0.1²), in ``np_dtype``."""
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
    biases = {}
    if cfg.qkv_bias:
        for n in range(cfg.layers):
            p = f"model.layers.{n}.self_attn."
            biases |= {p + "q_proj.bias": (cfg.heads * d,), p + "k_proj.bias": (cfg.kv_heads * d,),
                       p + "v_proj.bias": (cfg.kv_heads * d,)}
    out = {k: ((1 + 0.1 * rng.standard_normal(s)) if len(s) == 1 else
               0.1 * rng.standard_normal(s)).astype(np_dtype) for k, s in shapes.items()}
    return out | {k: (0.1 * rng.standard_normal(s)).astype(np_dtype) for k, s in biases.items()}
