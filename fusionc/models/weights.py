"""Weights from ``*.safetensors`` (one file or a sharded ``model.safetensors.index.json``), read
with the ``safetensors`` package (numpy backend; bf16 through ``ml_dtypes``) and rearranged into
the fused tensors the decoder graphs take (``fusionc.models.blocks``).

Hugging Face names (Llama and Qwen3): ``model.embed_tokens.weight``, ``model.norm.weight``,
``lm_head.weight`` (absent when tied), and per layer ``model.layers.{i}.`` +
``input_layernorm``, ``self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm`` (Qwen3),
``post_attention_layernorm``, ``mlp.{gate,up,down}_proj`` (each ``.weight``), and for Qwen2
``self_attn.{q,k,v}_proj.bias``.

Arrays are returned in the device bit layout of the storage dtype
(``fusionc.runtime.transfer``: f16 as float16, bf16 as uint16 bit patterns, f32 as float32).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fusionc.errors import InputError
from fusionc.ir.types import DType
from fusionc.models.config import ModelConfig

INDEX = "model.safetensors.index.json"
_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


class SafetensorsWeights:
    """The tensors of a model folder by Hugging Face name.

    Raises InputError (naming the tensor and file) for a missing folder, file or tensor, a
    truncated or corrupt file, or a tensor whose shape differs from the config's.
    """

    def __init__(self, model_dir: str | Path):
        import ml_dtypes  # noqa: F401 - registers numpy's bfloat16 for safetensors' numpy backend
        self.dir = Path(model_dir)
        self.files = _weight_map(self.dir)

    def get(self, name: str, shape: tuple[int, ...], dtype: str, index=None) -> np.ndarray:
        """Tensor ``name`` checked against ``shape``, in the device bits of ``dtype``;
        ``index`` (a slice or a tuple of slices) reads only that part of it (a tensor-parallel
        rank's rows or columns)."""
        from safetensors import safe_open
        path = self.files.get(name)
        if path is None:
            raise InputError(f"tensor '{name}' is missing from {self.dir}",
                             valid=f"a {list(shape)} tensor '{name}'")
        try:
            with safe_open(str(path), framework="numpy") as f:
                part = f.get_slice(name)
                got, kind = tuple(part.get_shape()), part.get_dtype()
                arr = part[index] if index is not None and got == tuple(shape) else \
                    f.get_tensor(name)
        except Exception as e:  # safetensors raises its own error types for broken files
            raise InputError(f"cannot read tensor '{name}' from {path.name}: {e}",
                             valid="a complete safetensors file (re-download or re-save it)"
                             ) from None
        if arr.dtype.name not in _FLOAT_DTYPES:
            raise InputError(f"tensor '{name}' in {path.name} has dtype {arr.dtype.name} "
                             f"({kind})", valid=", ".join(_FLOAT_DTYPES))
        if got != tuple(shape):
            raise InputError(f"tensor '{name}' in {path.name} has shape {list(got)}",
                             valid=f"{list(shape)} for this config.json")
        return to_device_bits(np.ascontiguousarray(arr), dtype)


def _weight_map(d: Path) -> dict[str, Path]:
    """{tensor name: file} from the shard index, or from every ``*.safetensors`` file."""
    if not d.is_dir():
        raise InputError(f"model folder {d} does not exist", valid="a Hugging Face model folder")
    index = d / INDEX
    if index.exists():
        try:
            wmap = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise InputError(f"{index} is not a shard index ({e!r})",
                             valid='JSON with a "weight_map" {tensor: file}') from None
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            raise InputError(f"{index}: weight_map is not an object of file names",
                             valid='"weight_map": {"tensor name": "file.safetensors"}')
        return {k: d / v for k, v in wmap.items()}
    files = sorted(p for p in d.glob("*.safetensors") if p.is_file())
    if not files:
        raise InputError(f"no *.safetensors in {d}", valid=f"model.safetensors or {INDEX}")
    from safetensors import safe_open
    out = {}
    for p in files:
        try:
            with safe_open(str(p), framework="numpy") as f:
                out.update({k: p for k in f.keys()})
        except Exception as e:
            raise InputError(f"cannot read {p.name}: {e}",
                             valid="a complete safetensors file") from None
    return out


def to_device_bits(arr: np.ndarray, dtype: str) -> np.ndarray:
    """``arr`` (float16, bfloat16, float32 or float64) in the device bits of ``dtype``; bits are
    kept when the dtypes agree, otherwise values are rounded to nearest."""
    from fusionc.runtime.transfer import host_to_device_bits
    if arr.dtype.name == "bfloat16":
        if dtype == "bf16":
            return arr.view(np.uint16)
        arr = arr.astype(np.float32)
    if arr.dtype.name == {"f16": "float16", "f32": "float32"}.get(dtype):
        return arr
    return host_to_device_bits(arr.astype(np.float32), DType(dtype))


def layer_weights(src, cfg: ModelConfig, i: int, dtype: str | None = None) -> dict:
    """Layer ``i``'s inputs of the attention and MLP graphs: {param name: array}.

    ``w_qkv`` stacks q, k, v rows (``qkv_bias`` their biases, Qwen2); ``w_gate_up`` stacks
    gate and up rows.
    """
    dt = dtype or cfg.dtype
    h, d, inter = cfg.hidden, cfg.head_dim, cfg.intermediate
    q, kv = cfg.heads * d, cfg.kv_heads * d
    p = f"model.layers.{i}."

    def get(name, *shape):
        return src.get(p + name + ".weight", shape, dt)

    out = {
        "attn_norm": get("input_layernorm", h),
        "w_qkv": np.concatenate([get("self_attn.q_proj", q, h), get("self_attn.k_proj", kv, h),
                                 get("self_attn.v_proj", kv, h)]),
        "w_o": get("self_attn.o_proj", h, q),
        "mlp_norm": get("post_attention_layernorm", h),
        "w_gate_up": np.concatenate([get("mlp.gate_proj", inter, h),
                                     get("mlp.up_proj", inter, h)]),
        "w_down": get("mlp.down_proj", h, inter),
    }
    if cfg.qk_norm:
        out["q_norm"], out["k_norm"] = get("self_attn.q_norm", d), get("self_attn.k_norm", d)
    if cfg.qkv_bias:
        out["qkv_bias"] = np.concatenate([src.get(f"{p}self_attn.{n}_proj.bias", (rows,), dt)
                                          for n, rows in (("q", q), ("k", kv), ("v", kv))])
    return out


def head_weights(src, cfg: ModelConfig, dtype: str | None = None) -> dict:
    """``embed`` [vocab, hidden], ``final_norm`` [hidden], ``lm_head`` [vocab, hidden] (the
    embedding itself when the config ties them: ``tie_word_embeddings``)."""
    dt = dtype or cfg.dtype
    v, h = cfg.vocab, cfg.hidden
    embed = src.get("model.embed_tokens.weight", (v, h), dt)
    head = embed if cfg.tie_embeddings else src.get("lm_head.weight", (v, h), dt)
    return {"embed": embed, "final_norm": src.get("model.norm.weight", (h,), dt),
            "lm_head": head}


def random_layer(cfg: ModelConfig, i: int, dtype: str, xp=np, seed: int = 0) -> dict:
    """Random layer weights in device bits (``xp``: numpy, or cupy to generate on the GPU):
    projections N(0, 0.02²) as in Hugging Face's ``initializer_range``, norms N(1, 0.1²)."""
    shapes = {"attn_norm": (cfg.hidden,), "mlp_norm": (cfg.hidden,),
              "w_qkv": ((cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim, cfg.hidden),
              "w_o": (cfg.hidden, cfg.heads * cfg.head_dim),
              "w_gate_up": (2 * cfg.intermediate, cfg.hidden),
              "w_down": (cfg.hidden, cfg.intermediate)}
    if cfg.qk_norm:
        shapes["q_norm"] = shapes["k_norm"] = (cfg.head_dim,)
    bias = {"qkv_bias": (shapes["w_qkv"][0],)} if cfg.qkv_bias else {}

    def one(j, s, name=""):
        if name == "qkv_bias":   # biases N(0, 0.02²)
            return float32_to_bits(_normal(xp, (seed, i, j), s) * 0.02, dtype, xp)
        vec = len(s) == 1   # norm weights near 1, projections near 0
        return float32_to_bits(_normal(xp, (seed, i, j), s) * (0.1 if vec else 0.02)
                               + (1.0 if vec else 0.0), dtype, xp)
    return {k: one(j, s, k) for j, (k, s) in enumerate((shapes | bias).items())}


def random_head(cfg: ModelConfig, dtype: str, xp=np, seed: int = 0) -> dict:
    """Random ``embed``, ``final_norm`` and ``lm_head`` (tied when the config says so)."""
    vh = (cfg.vocab, cfg.hidden)
    embed = float32_to_bits(_normal(xp, (seed, -1, 0), vh) * 0.02, dtype, xp)
    head = embed if cfg.tie_embeddings else \
        float32_to_bits(_normal(xp, (seed, -1, 1), vh) * 0.02, dtype, xp)
    norm = float32_to_bits(1.0 + 0.1 * _normal(xp, (seed, -1, 2), (cfg.hidden,)), dtype, xp)
    return {"embed": embed, "final_norm": norm, "lm_head": head}


def _normal(xp, key: tuple, shape):
    """float32 N(0, 1) samples of ``shape`` from a stream named by ``key``."""
    seed = int(np.random.SeedSequence([k % 2**31 for k in key]).generate_state(1)[0])
    if xp is np:
        return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    return xp.random.RandomState(seed).standard_normal(shape, dtype=xp.float32)


def float32_to_bits(x, dtype: str, xp=np):
    """float32 ``x`` (numpy or CuPy, ``xp``) in the device bits of ``dtype`` (f16, bf16 as
    uint16 rounded to nearest even, f32), computed where ``x`` lives."""
    x = x.astype(xp.float32)
    if dtype == "bf16":
        u = x.view(xp.uint32)
        return ((u + xp.uint32(0x7FFF) + ((u >> 16) & xp.uint32(1))) >> 16).astype(xp.uint16)
    return x.astype({"f16": xp.float16, "f32": xp.float32}[dtype])
