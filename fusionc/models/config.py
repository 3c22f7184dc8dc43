"""Model configuration from a Hugging Face ``config.json``: the sizes fusionc builds graphs from.

Supported architectures: Llama 2 and 3 (``LlamaForCausalLM``, including Llama 3.1's
``rope_scaling`` of type ``llama3`` and tied embeddings) and Qwen3 (``Qwen3ForCausalLM``: QK-norm,
an explicit ``head_dim``). Field meanings follow ``transformers``' ``LlamaConfig`` and
``Qwen3Config``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fusionc.errors import InputError

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}
_DTYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and constants of a decoder-only model.

    ``rope_scaling`` is ``()`` or Llama 3.1's ``(factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings)``; ``dtype`` is the weights' storage dtype (f16, bf16, f32).
    """

    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    theta: float
    rope_scaling: tuple = ()
    tie_embeddings: bool = False
    max_position: int = 4096
    dtype: str = "f16"

    @property
    def qk_norm(self) -> bool:
        """Whether each q and k head is RMS-normalized before RoPE (Qwen3)."""
        return self.arch == "qwen3"

    def weight_bytes(self) -> int:
        """Bytes of all weights in the storage dtype (the LM head counted once when tied)."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, \
            self.intermediate
        layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h + (2 * self.head_dim
                                                                 if self.qk_norm else 0)
        head = 0 if self.tie_embeddings else self.vocab * h
        item = {"f16": 2, "bf16": 2, "f32": 4}[self.dtype]
        return item * (self.layers * layer + self.vocab * h + h + head)


def load_config(model_dir: str | Path) -> ModelConfig:
    """The :class:`ModelConfig` of ``model_dir/config.json``.

    Raises:
        InputError: no config.json, invalid JSON, an unsupported architecture or rope scaling,
            missing or inconsistent sizes; the message names the file and what is valid.
    """
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"no {path}", valid="a Hugging Face model folder with config.json and "
                         "*.safetensors") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path} is not valid JSON ({e})", valid="a config.json") from None
    return config_from_dict(raw, str(path))


def config_from_dict(raw: dict, where: str = "config") -> ModelConfig:
    """:class:`ModelConfig` from the dict of a ``config.json`` (see :func:`load_config`)."""
    arch = _arch(raw, where)
    get = _getter(raw, where)
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    kv_heads = get("num_key_value_heads", heads)
    head_dim = raw.get("head_dim") or hidden // heads
    if heads % kv_heads:
        raise InputError(f"{where}: num_attention_heads {heads} is not a multiple of "
                         f"num_key_value_heads {kv_heads}", valid="GQA groups of equal size")
    for flag in ("attention_bias", "mlp_bias"):
        if raw.get(flag):
            raise InputError(f"{where}: {flag} = true", valid="projections without bias")
    if raw.get("hidden_act", "silu") != "silu":
        raise InputError(f"{where}: hidden_act = {raw['hidden_act']!r}", valid="silu (SwiGLU)")
    dt = str(raw.get("torch_dtype") or raw.get("dtype") or "float16")
    if dt not in _DTYPES:
        raise InputError(f"{where}: dtype {dt!r}", valid=", ".join(_DTYPES))
    return ModelConfig(
        arch=arch, layers=get("num_hidden_layers"), hidden=hidden, heads=heads,
        kv_heads=kv_heads, head_dim=int(head_dim), intermediate=get("intermediate_size"),
        vocab=get("vocab_size"), eps=float(raw.get("rms_norm_eps", 1e-6)),
        theta=_theta(raw), rope_scaling=_rope_scaling(raw, where),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        max_position=int(raw.get("max_position_embeddings", 4096)), dtype=_DTYPES[dt])


def _arch(raw: dict, where: str) -> str:
    names = raw.get("architectures") or []
    for n in names:
        if n in ARCHITECTURES:
            return ARCHITECTURES[n]
    kind = raw.get("model_type")
    if kind in ARCHITECTURES.values() and not names:
        return kind
    raise InputError(f"{where}: unsupported architecture {names or kind!r}",
                     valid=", ".join(ARCHITECTURES))


def _getter(raw: dict, where: str):
    def get(key, default=None):
        v = raw.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InputError(f"{where}: {key} = {v!r}", valid=f"a positive integer {key}")
        return v
    return get


def _theta(raw: dict) -> float:
    """``rope_theta``, top level (transformers 4) or in ``rope_parameters`` (transformers 5)."""
    params = raw.get("rope_parameters") or {}
    return float(raw.get("rope_theta") or params.get("rope_theta") or 10000.0)


def _rope_scaling(raw: dict, where: str) -> tuple:
    rs = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not rs:
        return ()
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "default":
        return ()
    if kind != "llama3":
        raise InputError(f"{where}: rope_scaling type {kind!r}", valid="llama3 or none")
    try:
        return tuple(float(rs[k]) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                            "original_max_position_embeddings"))
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{where}: rope_scaling {rs}", valid="llama3 scaling with factor, "
                         "low_freq_factor, high_freq_factor, original_max_position_embeddings"
                         ) from None
