"""The decode step of :class:`fusionc.models.decoder.Decoder` on the CPU: the same layer graphs
and the step's ends (embedding, final RMSNorm, LM head with fp32 logits) run in fusionc's
interpreter (fp32 arithmetic, every result rounded to its dtype, as the GPU kernels compute).
For tests, notebooks and
checking a model folder on a machine without a GPU; slow (seconds per token at real sizes).

``tp = N`` runs the tensor-parallel layer (:func:`fusionc.models.blocks.tp_layer_block`) over N
simulated ranks in lockstep (the interpreter's ranks; all-reduces sum in rank order): each rank
holds its shard of every layer (:mod:`fusionc.models.tp`, read from the checkpoint shard by
shard) and its KV heads' caches; embedding, final norm and LM head are replicated.
"""
from __future__ import annotations

import numpy as np

from fusionc.errors import InputError
from fusionc.ir.types import DType
from fusionc.models.config import ModelConfig
from fusionc.models.decoder import Decoder
from fusionc.runtime.transfer import device_bits_to_host


class HostDecoder(Decoder):
    """:class:`Decoder` on the CPU (same arguments; ``kv_len``, ``autotune`` and ``progress``
    are ignored: nothing is compiled). :meth:`step` returns numpy logits: fp32, or float64 with
    ``precise=True`` (the interpreter's reference mode: float64 arithmetic, no rounding of
    intermediate results inside a block; the hidden state between blocks and the KV cache are
    still stored in the dtype, as on the GPU). f32 models run in f32 here. ``tp``: simulated
    tensor-parallel ranks (see the module docstring; InputError from
    :func:`fusionc.models.tp.check_tp` for sizes or models that do not shard)."""

    DTYPES = ("f16", "bf16", "f32")

    def __init__(self, cfg: ModelConfig, *, batch: int = 1, max_seq: int | None = None,
                 kv_len: int | None = None, dtype: str | None = None, autotune: bool = False,
                 progress=None, pdl: bool = False, precise: bool = False, tp: int = 1):
        del kv_len, autotune, progress, pdl  # nothing is compiled on the CPU
        from fusionc.models.tp import check_tp
        check_tp(cfg, tp)
        self._setup(cfg, batch, max_seq, dtype)
        tp = int(tp)   # numpy integers too
        self.precise, self.tp = precise, tp
        if tp > 1:
            from fusionc.models.blocks import tp_layer_block
            self.module = tp_layer_block(
                hidden=cfg.hidden, heads=cfg.heads, kv_heads=cfg.kv_heads,
                head_dim=cfg.head_dim, intermediate=cfg.intermediate, tp=tp,
                max_seq=self.max_seq, eps=cfg.eps, theta=cfg.theta, dtype=self.dtype,
                rope_scaling=cfg.rope_scaling)

    def layer_from(self, src, i: int):
        """Layer ``i``'s weights from ``src``: a dict, or with ``tp`` one shard per rank (each
        read alone, :func:`fusionc.models.tp.layer_shard`)."""
        if self.tp == 1:
            return super().layer_from(src, i)
        from fusionc.models.tp import layer_shard
        return [layer_shard(src, self.cfg, i, r, self.tp, self.dtype) for r in range(self.tp)]

    @staticmethod
    def array_module():
        """numpy."""
        return np

    def load(self, layers, head: dict) -> None:
        """Weights as values (bf16 held in float32 after rounding); KV caches of zeros. With
        ``tp``, each layer is a list of the ranks' shards, or a whole layer's dict (sharded
        here, :func:`fusionc.models.tp.shard_weights`); ``self.layers[i]`` is then a list of
        per-rank dicts."""
        dt = DType(self.dtype)
        c = self.cfg
        cache = (self.batch, self.max_seq, c.kv_heads // self.tp, c.head_dim)

        def host(w):
            w = {k: device_bits_to_host(np.asarray(v), dt) for k, v in w.items()}
            w["k_cache"], w["v_cache"] = (np.zeros(cache, self._acc(dt)) for _ in "kv")
            return w
        self.layers = []
        for w in layers:
            if not isinstance(w, dict) and (self.tp == 1 or len(w) != self.tp):
                raise InputError(f"a layer of {type(w).__name__} "
                                 f"{len(w) if isinstance(w, list) else ''}",
                                 valid="a dict of the whole layer's weights" +
                                       (f", or a list of {self.tp} rank shards"
                                        if self.tp > 1 else ""))
            if self.tp == 1:
                self.layers.append(host(w))
                continue
            if isinstance(w, dict):
                from fusionc.models.tp import shard_weights
                w = [shard_weights(w, r, self.tp, heads=c.heads, kv_heads=c.kv_heads,
                                   head_dim=c.head_dim, intermediate=c.intermediate)
                     for r in range(self.tp)]
            self.layers.append([host(s) for s in w])
        if len(self.layers) != c.layers:
            raise InputError(f"{len(self.layers)} layers of weights",
                             valid=f"{c.layers} (num_hidden_layers of the config)")
        self.embed, self.final_norm = (device_bits_to_host(np.asarray(head[k]), dt)
                                       for k in ("embed", "final_norm"))
        self.lm_head = self.embed if head["lm_head"] is head["embed"] else \
            device_bits_to_host(np.asarray(head["lm_head"]), dt)

    def step(self, tokens, positions) -> np.ndarray:
        """One decode step (see :meth:`Decoder.step`); numpy fp32 logits ``[batch, vocab]``."""
        if not self.layers:
            raise InputError("the decoder has no weights", valid="load() them first, or build "
                             "it with HostDecoder.from_pretrained / HostDecoder.random")
        tokens, positions = self._check(tokens, positions)
        x = self._embed(tokens)
        run = {"positions": positions, "seq_lens": positions + 1}
        if self.tp > 1:
            return self._logits(self._tp_layers(x, run, self.module, "layer"))
        return self._logits(self._layers(x, run, self.module, "attention"))

    def _chunk_layers(self, x: np.ndarray, seq_of, positions, chunk=None) -> np.ndarray:
        """Every layer for the rows of one chunk (:meth:`Decoder.prefill`), in the
        interpreter."""
        run = {"positions": positions, "seq_of": seq_of}
        if self.tp > 1:
            return self._tp_layers(x, run, self._chunk_module(), "layer_chunk")
        return self._layers(x, run, self._chunk_module(), "attention_chunk")

    def _chunk_module(self):
        """``@attention_chunk`` (or with tp ``@layer_chunk``) for this model (built once)."""
        if getattr(self, "_chunk", None) is None:
            from fusionc.models.prefill import chunk_attention_block, tp_chunk_layer_block
            c = self.cfg
            if self.tp > 1:
                self._chunk = tp_chunk_layer_block(
                    hidden=c.hidden, heads=c.heads, kv_heads=c.kv_heads, head_dim=c.head_dim,
                    intermediate=c.intermediate, tp=self.tp, max_seq=self.max_seq, eps=c.eps,
                    theta=c.theta, dtype=self.dtype, rope_scaling=c.rope_scaling)
                return self._chunk
            self._chunk = chunk_attention_block(
                hidden=c.hidden, heads=c.heads, kv_heads=c.kv_heads, head_dim=c.head_dim,
                max_seq=self.max_seq, eps=c.eps, theta=c.theta, dtype=self.dtype,
                qk_norm=c.qk_norm, rope_scaling=c.rope_scaling, qkv_bias=c.qkv_bias)
        return self._chunk

    def _layers(self, x: np.ndarray, run: dict, module, attention: str) -> np.ndarray:
        """Every layer: graph ``attention`` of ``module`` (run-time inputs ``run``), then
        ``@mlp``; the KV caches are updated."""
        from fusionc.interp.interpreter import interpret
        attn = [p.name for p in module[attention].params]
        mlp = [p.name for p in self.module["mlp"].params]
        for w in self.layers:
            x, w["k_cache"], w["v_cache"] = interpret(
                module, {n: run[n] if n in run else w[n] for n in attn if n != "x"} | {"x": x},
                graph=attention, precise=self.precise)
            (x,) = interpret(self.module, {n: w[n] for n in mlp if n != "x"} | {"x": x},
                             graph="mlp", precise=self.precise)
        return x

    def _embed(self, tokens: np.ndarray, chunk=None) -> np.ndarray:
        """Graph ``@embed`` of :attr:`ends`: the hidden states ``[rows, hidden]`` of ids
        ``tokens``."""
        from fusionc.interp.interpreter import interpret
        (x,) = interpret(self.ends, {"embed": self.embed, "tokens": tokens.astype(np.int32)},
                         graph="embed", precise=self.precise)
        return x

    def _logits(self, x: np.ndarray) -> np.ndarray:
        """Graph ``@head`` of :attr:`ends`: final RMSNorm (rounded to the dtype unless
        precise) and LM head of hidden states ``[rows, hidden]``, fp32 logits (float64 when
        precise)."""
        from fusionc.interp.interpreter import interpret
        (y,) = interpret(self.ends, {"x": x, "final_norm": self.final_norm,
                                     "lm_head": self.lm_head}, graph="head",
                         precise=self.precise)
        return y

    def _tp_layers(self, x: np.ndarray, run: dict, module, graph: str) -> np.ndarray:
        """Every layer (graph ``graph`` of ``module``) over the simulated ranks in lockstep;
        the ranks' hidden states agree (the all-reduces give every rank the same sums), rank
        0's goes on."""
        from fusionc.interp.interpreter import interpret
        names = [p.name for p in module[graph].params]
        for ranks in self.layers:
            ins = [{n: x if n == "x" else run[n] if n in run else w[n] for n in names}
                   for w in ranks]
            outs = interpret(module, ins, graph=graph, precise=self.precise)
            for w, (_, kc, vc) in zip(ranks, outs):
                w["k_cache"], w["v_cache"] = kc, vc
            x = outs[0][0]
        return x

    def _acc(self, dt: DType):
        """Host dtype of values: float64 when precise, else the dtype's numpy type."""
        return np.float64 if self.precise else dt.numpy

    def replay(self) -> None:
        """Not available on the CPU (nothing is captured)."""
        raise InputError("HostDecoder has no captured step to replay", valid="step()")
