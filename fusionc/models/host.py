"""The decode step of :class:`fusionc.models.decoder.Decoder` on the CPU: the same layer graphs
run in fusionc's interpreter (fp32 arithmetic, every result rounded to its dtype, as the GPU
kernels compute); embedding, final RMSNorm and LM head in numpy fp32. For tests, notebooks and
checking a model folder on a machine without a GPU; slow (seconds per token at real sizes).
"""
from __future__ import annotations

import numpy as np

from fusionc.errors import InputError
from fusionc.interp.numerics import round_to
from fusionc.ir.types import DType
from fusionc.models.config import ModelConfig
from fusionc.models.decoder import Decoder
from fusionc.runtime.transfer import device_bits_to_host


class HostDecoder(Decoder):
    """:class:`Decoder` on the CPU (same arguments; ``kv_len``, ``autotune`` and ``progress``
    are ignored: nothing is compiled). :meth:`step` returns numpy logits: fp32, or float64 with
    ``precise=True`` (the interpreter's reference mode: float64 arithmetic, no rounding of
    intermediate results inside a block; the hidden state between blocks and the KV cache are
    still stored in the dtype, as on the GPU). f32 models run in f32 here."""

    DTYPES = ("f16", "bf16", "f32")

    def __init__(self, cfg: ModelConfig, *, batch: int = 1, max_seq: int | None = None,
                 kv_len: int | None = None, dtype: str | None = None, autotune: bool = False,
                 progress=None, pdl: bool = False, precise: bool = False):
        del kv_len, autotune, progress, pdl  # nothing is compiled on the CPU
        self._setup(cfg, batch, max_seq, dtype)
        self.precise = precise

    @staticmethod
    def array_module():
        """numpy."""
        return np

    def load(self, layers, head: dict) -> None:
        """Weights as values (bf16 held in float32 after rounding); KV caches of zeros."""
        dt = DType(self.dtype)
        c = self.cfg
        cache = (self.batch, self.max_seq, c.kv_heads, c.head_dim)
        self.layers = []
        for w in layers:
            w = {k: device_bits_to_host(np.asarray(v), dt) for k, v in w.items()}
            w["k_cache"], w["v_cache"] = (np.zeros(cache, self._acc(dt)) for _ in "kv")
            self.layers.append(w)
        if len(self.layers) != c.layers:
            raise InputError(f"{len(self.layers)} layers of weights",
                             valid=f"{c.layers} (num_hidden_layers of the config)")
        head_dt = np.float64 if self.precise else np.float32   # final norm and LM head: fp32
        self.embed, self.final_norm = (device_bits_to_host(np.asarray(head[k]), dt).astype(head_dt)
                                       for k in ("embed", "final_norm"))
        self.lm_head = self.embed if head["lm_head"] is head["embed"] else \
            device_bits_to_host(np.asarray(head["lm_head"]), dt).astype(head_dt)

    def step(self, tokens, positions) -> np.ndarray:
        """One decode step (see :meth:`Decoder.step`); numpy fp32 logits ``[batch, vocab]``."""
        from fusionc.interp.interpreter import interpret
        if not self.layers:
            raise InputError("the decoder has no weights", valid="load() them first, or build "
                             "it with HostDecoder.from_pretrained / HostDecoder.random")
        tokens, positions = self._check(tokens, positions)
        dt = DType(self.dtype)
        x = self.embed[tokens].astype(dt.numpy if not self.precise else np.float64)
        run = {"positions": positions, "seq_lens": positions + 1}
        attn = [p.name for p in self.module["attention"].params]
        mlp = [p.name for p in self.module["mlp"].params]
        for w in self.layers:
            x, w["k_cache"], w["v_cache"] = interpret(
                self.module, {n: run[n] if n in run else w[n] for n in attn if n != "x"} | {"x": x},
                graph="attention", precise=self.precise)
            (x,) = interpret(self.module, {n: w[n] for n in mlp if n != "x"} | {"x": x},
                             graph="mlp", precise=self.precise)
        x = x.astype(self.lm_head.dtype)
        normed = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + self.cfg.eps)
        normed = normed * self.final_norm
        if not self.precise:
            normed = round_to(normed, dt).astype(np.float32)
        return normed @ self.lm_head.T

    def _acc(self, dt: DType):
        """Host dtype of values: float64 when precise, else the dtype's numpy type."""
        return np.float64 if self.precise else dt.numpy

    def replay(self) -> None:
        """Not available on the CPU (nothing is captured)."""
        raise InputError("HostDecoder has no captured step to replay", valid="step()")
