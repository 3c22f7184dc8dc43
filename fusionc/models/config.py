"""Model configuration from a Hugging Face ``config.json``: the sizes fusionc builds graphs from.

Supported architectures: Llama 2 and 3 (``LlamaForCausalLM``, including Llama 3.1's
``rope_scaling`` of type ``llama3`` and tied embeddings), Qwen2 / Qwen2.5 (``Qwen2ForCausalLM``:
a bias on the q, k and v projections, tied or untied LM head; the fused GPU kernels do not take
the bias yet, so these run on the CPU path) and Qwen3 (``Qwen3ForCausalLM``: QK-norm, an
explicit ``head_dim``). Field meanings follow ``transformers``' ``LlamaConfig``,
``Qwen2Config`` and ``Qwen3Config``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from fusionc.errors import InputError

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                 "Qwen3ForCausalLM": "qwen3"}
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

    @property
    def qkv_bias(self) -> bool:
        """Whether the q, k and v projections have a bias (Qwen2 / Qwen2.5; o_proj has none)."""
        return self.arch == "qwen2"

    def weight_bytes(self) -> int:
        """Bytes of all weights in the storage dtype (the LM head counted once when tied)."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, \
            self.intermediate
        layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h + (2 * self.head_dim
                                                                 if self.qk_norm else 0) \
            + (q + 2 * kv if self.qkv_bias else 0)
        head = 0 if self.tie_embeddings else self.vocab * h
        item = {"f16": 2, "bf16": 2, "f32": 4}[self.dtype]
        return item * (self.layers * layer + self.vocab * h + h + head)


def load_config(model_dir: str | Path) -> ModelConfig:
    """The :class:`ModelConfig` of ``model_dir/config.json``.

    Raises:
        InputError: no such folder, no config.json, invalid JSON, an unsupported architecture
            or rope scaling, missing, ill-typed or inconsistent fields; the message names the
            file and what is valid.
    """
    if not isinstance(model_dir, (str, Path)):
        raise InputError(f"model folder {model_dir!r}", valid="a path (str or pathlib.Path)")
    folder = Path(model_dir)
    if not folder.is_dir():
        raise InputError(f"model folder {folder} does not exist or is not a folder",
                         valid="a Hugging Face model folder with config.json and *.safetensors")
    path = folder / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"no {path}", valid="a Hugging Face model folder with config.json and "
                         "*.safetensors") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path} is not valid JSON ({e})", valid="a config.json") from None
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}", valid="a config.json file") from None
    return config_from_dict(raw, str(path))


def config_from_dict(raw: dict, where: str = "config") -> ModelConfig:
    """:class:`ModelConfig` from the dict of a ``config.json`` (see :func:`load_config`)."""
    if not isinstance(raw, dict):
        raise InputError(f"{where} holds a {type(raw).__name__}", valid="a JSON object")
    f = _Fields(raw, where)
    arch = _arch(raw, where)
    hidden, heads = f.pos_int("hidden_size"), f.pos_int("num_attention_heads")
    kv_heads = f.pos_int("num_key_value_heads", heads)
    head_dim = f.pos_int("head_dim", None) if raw.get("head_dim") is not None else None
    if head_dim is None:
        if hidden % heads:
            raise InputError(f"{where}: hidden_size {hidden} is not a multiple of "
                             f"num_attention_heads {heads}", valid="an explicit head_dim")
        head_dim = hidden // heads
    if head_dim % 2:
        raise InputError(f"{where}: head_dim {head_dim}", valid="an even head_dim (RoPE pairs)")
    if heads % kv_heads:
        raise InputError(f"{where}: num_attention_heads {heads} is not a multiple of "
                         f"num_key_value_heads {kv_heads}", valid="GQA groups of equal size")
    for flag in ("attention_bias", "mlp_bias", "use_sliding_window"):
        if f.flag(flag, False):
            raise InputError(f"{where}: {flag} = true", valid=f"{flag} = false (not supported)")
    if raw.get("hidden_act", "silu") != "silu":
        raise InputError(f"{where}: hidden_act = {raw['hidden_act']!r}", valid="silu (SwiGLU)")
    dt = raw.get("torch_dtype") or raw.get("dtype") or "float16"
    if not isinstance(dt, str) or dt not in _DTYPES:
        raise InputError(f"{where}: dtype {dt!r}", valid=", ".join(_DTYPES))
    return ModelConfig(
        arch=arch, layers=f.pos_int("num_hidden_layers"), hidden=hidden, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, intermediate=f.pos_int("intermediate_size"),
        vocab=f.pos_int("vocab_size"), eps=f.pos_float("rms_norm_eps", 1e-6), theta=_theta(f),
        rope_scaling=_rope_scaling(f), tie_embeddings=f.flag("tie_word_embeddings", False),
        max_position=f.pos_int("max_position_embeddings", 4096), dtype=_DTYPES[dt])


class _Fields:
    """Typed readers of config.json fields; InputError naming the file, key and what is valid."""

    def __init__(self, raw: dict, where: str):
        self.raw, self.where = raw, where

    def _bad(self, key, v, valid):
        return InputError(f"{self.where}: {key} = {v!r}", valid=valid)

    def pos_int(self, key: str, default=None, raw: dict | None = None) -> int:
        v = (self.raw if raw is None else raw).get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise self._bad(key, v, f"a positive integer {key}")
        return v

    def pos_float(self, key: str, default=None, raw: dict | None = None) -> float:
        v = (self.raw if raw is None else raw).get(key, default)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf:
            raise self._bad(key, v, f"a finite number {key} > 0")
        return float(v)

    def flag(self, key: str, default: bool) -> bool:
        v = self.raw.get(key, default)
        if not isinstance(v, bool):
            raise self._bad(key, v, "true or false")
        return v

    def obj(self, key: str) -> dict | None:
        v = self.raw.get(key)
        if v is not None and not isinstance(v, dict):
            raise self._bad(key, v, "a JSON object or null")
        return v


def _arch(raw: dict, where: str) -> str:
    names = raw.get("architectures") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InputError(f"{where}: architectures = {names!r}", valid="a list of class names")
    for n in names:
        if n in ARCHITECTURES:
            return ARCHITECTURES[n]
    kind = raw.get("model_type")
    if kind in ARCHITECTURES.values() and not names:
        return kind
    raise InputError(f"{where}: unsupported architecture {names or kind!r}",
                     valid=", ".join(ARCHITECTURES))


def _theta(f: _Fields) -> float:
    """``rope_theta``, top level (transformers 4) or in ``rope_parameters`` (transformers 5)."""
    params = f.obj("rope_parameters") or {}
    if "rope_theta" in f.raw:
        return f.pos_float("rope_theta")
    return f.pos_float("rope_theta", 10000.0, raw=params)


def _rope_scaling(f: _Fields) -> tuple:
    rs = f.obj("rope_scaling") or f.obj("rope_parameters")
    if not rs:
        return ()
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "default":
        return ()
    if kind != "llama3":
        raise InputError(f"{f.where}: rope_scaling type {kind!r}", valid="llama3 or none")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    if any(k not in rs for k in keys):
        raise InputError(f"{f.where}: rope_scaling {rs}", valid="llama3 scaling with " +
                         ", ".join(keys))
    out = tuple(f.pos_float(k, raw=rs) for k in keys)
    if out[1] >= out[2]:
        raise InputError(f"{f.where}: rope_scaling low_freq_factor {out[1]} >= "
                         f"high_freq_factor {out[2]}", valid="low_freq_factor < high_freq_factor")
    return out
