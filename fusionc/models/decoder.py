"""A whole decoder-only model on the GPU: every layer runs fusionc's fused attention and MLP
kernels (compiled once, shared by all layers), and the step's ends are fusionc graphs too
(:func:`fusionc.models.blocks.step_ends`: the embedding's gather, the final RMSNorm and the LM
head as a linear with fp32 logits). One decode step — embedding, all layers, final norm, LM
head — is one CUDA graph, captured on the first step and replayed afterwards with new tokens,
positions and KV lengths (run-time arguments; nothing recompiles).

KV cache: contiguous per sequence, ``[batch, max_seq, kv_heads, head_dim]`` per layer for K and V.
Prompts run in chunks of up to 256 tokens (:meth:`Decoder.prefill`, ``fusionc/models/prefill.py``:
on the GPU its attention, RoPE and cache write are library kernels and its linears cuBLAS GEMMs,
``fusionc.runtime.library_attention``), or through the decode step one token at a time.
"""
from __future__ import annotations

import numbers
from pathlib import Path

import numpy as np

from fusionc.errors import CompileError, InputError
from fusionc.models.blocks import layer_module, step_ends
from fusionc.models.config import ModelConfig, load_config


class Decoder:
    """The decode step of model ``cfg`` for ``batch`` sequences of up to ``max_seq`` tokens.

    Args:
        cfg: sizes (:func:`fusionc.models.config.load_config`).
        batch: sequences decoded together (the kernels' batch bucket).
        max_seq: KV cache capacity in tokens (default: min(max_position_embeddings, 4096)).
        kv_len: the KV length a tuned choice is stored for (default max_seq / 2).
        dtype: storage dtype f16 or bf16 (default the config's; f32 models run in f16).
        autotune, progress: as in :func:`fusionc.compile` (progress: callable(str)).
        pdl: programmatic dependent launch between the layer kernels (off by default: measured
            neutral on whole decode steps, BENCHMARKS.md).
        tp: tensor-parallel ranks; only 1 on GPUs so far (InputError otherwise;
            :class:`~fusionc.models.HostDecoder` simulates ranks on the CPU).
    Load weights with :meth:`load` (or build with :meth:`from_pretrained` / :meth:`random`),
    then call :meth:`step`. Raises CompileError when a kernel cannot be built, InputError for
    invalid sizes.
    """

    DTYPES = ("f16", "bf16")
    prefills = True   # prompts in chunks (prefill), see fusionc.models.generate

    def __init__(self, cfg: ModelConfig, *, batch: int = 1, max_seq: int | None = None,
                 kv_len: int | None = None, dtype: str | None = None, autotune: bool = False,
                 progress=None, pdl: bool = False, tp: int = 1):
        import fusionc
        if tp != 1:
            raise InputError(f"Decoder(tp={tp!r}) on GPUs",
                             valid="tp = 1, or HostDecoder(tp=N) (simulated ranks on the CPU): "
                                   "the GPU decoder does not shard over ranks yet")
        check_gpu_support(cfg)
        self._setup(cfg, batch, max_seq, dtype)
        opts = dict(max_batch=batch, kv_len=kv_len or max(1, self.max_seq // 2),
                    autotune=autotune, progress=progress, pdl=pdl)
        self.attention = fusionc.compile(self.module, "attention", **opts)
        self.mlp = fusionc.compile(self.module, "mlp", **opts)
        self.embed_graph = fusionc.compile(self.ends, "embed", max_batch=batch)  # a gather
        self.head_graph = fusionc.compile(self.ends, "head", **opts)

    def _setup(self, cfg: ModelConfig, batch: int, max_seq: int | None, dtype: str | None):
        """Sizes, the layer graphs (``fusionc.models.blocks.layer_module``) and the step's ends
        (``step_ends``)."""
        self.cfg = cfg
        self.batch = _positive("batch", batch)
        self.max_seq = min(cfg.max_position, 4096) if max_seq is None else \
            _positive("max_seq", max_seq)
        if self.max_seq > cfg.max_position:
            raise InputError(f"max_seq {self.max_seq} exceeds the model's "
                             f"max_position_embeddings {cfg.max_position}",
                             valid=f"max_seq <= {cfg.max_position}")
        self.dtype = dtype or (cfg.dtype if cfg.dtype in self.DTYPES else "f16")
        if self.dtype not in self.DTYPES:
            raise InputError(f"dtype {self.dtype!r}", valid=" or ".join(self.DTYPES))
        self.module = layer_module(cfg, self.max_seq, self.dtype)
        self.ends = step_ends(cfg, self.dtype)
        self.layers, self._chunked, self._captures = [], {}, {}

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, *, progress=None, **kw) -> "Decoder":
        """Config and weights from a Hugging Face folder (``config.json``, ``*.safetensors``)."""
        from fusionc.models.weights import SafetensorsWeights, head_weights
        cfg = load_config(model_dir)
        src = SafetensorsWeights(model_dir)
        from tqdm import tqdm
        dec = cls(cfg, progress=progress, **kw)
        layers = tqdm(range(cfg.layers), desc="loading weights", unit="layer",
                      disable=progress is None, leave=False)
        dec.load((dec.layer_from(src, i) for i in layers), head_weights(src, cfg, dec.dtype))
        return dec

    def layer_from(self, src, i: int):
        """Layer ``i``'s weights from checkpoint ``src`` as :meth:`load` takes them."""
        from fusionc.models.weights import layer_weights
        return layer_weights(src, self.cfg, i, self.dtype)

    @classmethod
    def random(cls, cfg: ModelConfig, seed: int = 0, **kw) -> "Decoder":
        """Random weights (generated on the GPU for :class:`Decoder`; benchmarks and tests)."""
        from fusionc.models.weights import random_head, random_layer
        dec = cls(cfg, **kw)
        if dec.array_module() is not np:
            from fusionc.runtime.arrays import require_gpu
            require_gpu()
        xp = dec.array_module()
        dec.load((random_layer(cfg, i, dec.dtype, xp, seed) for i in range(cfg.layers)),
                 random_head(cfg, dec.dtype, xp, seed))
        return dec

    @staticmethod
    def array_module():
        """The array module of this decoder's buffers (cupy)."""
        import cupy
        return cupy

    def load(self, layers, head: dict) -> None:
        """Upload per-layer weights (an iterable of dicts from
        :func:`fusionc.models.weights.layer_weights`) and the embedding/head weights; allocate
        the KV caches and step buffers."""
        import cupy

        from fusionc.ir.types import DType
        from fusionc.runtime.arrays import _CUPY, require_gpu
        require_gpu()
        c, B, dt = self.cfg, self.batch, _CUPY[DType(self.dtype)]
        cache = (B, self.max_seq, c.kv_heads, c.head_dim)
        # captures read the old weights and caches: drop them, then what kept them alive
        self._graph, self._captures, self.layers = None, {}, []
        for g in (self.attention, self.mlp, self.embed_graph, self.head_graph,
                  *(x for gs in self._chunked.values() for x in gs.values())):
            g.forget_captures()
        for w in layers:
            w = {k: cupy.asarray(v) for k, v in w.items()}
            w["k_cache"], w["v_cache"] = cupy.zeros(cache, dt), cupy.zeros(cache, dt)
            self.layers.append(w)
        if len(self.layers) != c.layers:
            raise InputError(f"{len(self.layers)} layers of weights", valid=f"{c.layers} "
                             "(num_hidden_layers of the config)")
        self.embed = cupy.asarray(head["embed"])
        self.lm_head = self.embed if head["lm_head"] is head["embed"] else \
            cupy.asarray(head["lm_head"])   # tied embeddings: one copy on the GPU
        self.final_norm = cupy.asarray(head["final_norm"])
        self.logits = cupy.empty((B, c.vocab), cupy.float32)
        self.tokens, self.positions, self.seq_lens = (cupy.zeros(B, cupy.int32) for _ in "tps")
        self.x = [cupy.empty((B, c.hidden), dt) for _ in range(2)]  # ping-pong hidden states
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def step(self, tokens, positions):
        """Run one decode step: token ``tokens[b]`` of sequence b sits at ``positions[b]`` and
        attends over positions 0..positions[b]. Returns the fp32 logits ``[batch, vocab]`` (a
        CuPy buffer overwritten by the next step, ready on the caller's current stream).
        Raises InputError for tokens outside the vocabulary or positions outside the KV cache.
        """
        import cupy
        if not self.layers:
            raise InputError("the decoder has no weights", valid="load() them first, or build "
                             "it with Decoder.from_pretrained / Decoder.random")
        tokens, positions = self._check(tokens, positions)
        caller = cupy.cuda.get_current_stream()
        self.stream.wait_event(caller.record())  # the caller is done with the last logits
        self.tokens.set(tokens, stream=self.stream)
        self.positions.set(positions, stream=self.stream)
        self.seq_lens.set(positions + 1, stream=self.stream)
        with self.stream:
            if self._graph is None:
                self._graph = self._capture()
            self._graph.launch(self.stream)
        caller.wait_event(self.stream.record())      # the caller's stream sees this step's logits
        return self.logits

    def prefill(self, prompts, chunk: int | None = None):
        """Run the prompts through the model in chunks of at most ``chunk`` new tokens
        (default :data:`fusionc.models.prefill.CHUNK`, 256) rather than one decode step per
        token (:mod:`fusionc.models.prefill`): sequence b gets ``prompts[b]`` (lengths may
        differ) at positions 0, 1, ...; the KV caches hold them afterwards. Returns the logits
        after each sequence's last prompt token, ``[batch, vocab]`` (as :meth:`step`).

        Raises:
            InputError: not one non-empty prompt per sequence, a prompt longer than max_seq,
                ids outside the vocabulary, or a chunk < 1.
        """
        from fusionc.models.prefill import CHUNK, chunks, prompt_ids
        if not self.layers:
            raise InputError("the decoder has no weights", valid="load() them first")
        seqs = prompt_ids(prompts, self.batch, self.max_seq, self.cfg.vocab)
        lengths = [len(q) for q in seqs]
        last = [None] * self.batch
        for seq_of, pos, off in chunks(lengths, [0] * self.batch,
                                       CHUNK if chunk is None else chunk):
            x = self._embed(np.array([seqs[b][i] for b, i in zip(seq_of, off)], np.int32),
                            chunk)
            x = self._chunk_layers(x, seq_of, pos, chunk)
            for r, (b, i) in enumerate(zip(seq_of, off)):
                if i == lengths[b] - 1:
                    last[b] = x[r].copy()   # a replay's output is overwritten by the next
        return self._logits(self.array_module().stack(last))

    def _chunk_graphs(self, chunk: int | None) -> dict:
        """The compiled graphs of chunks of up to ``chunk`` rows (buckets of at least 256, and
        at least the batch: the caches' rows): ``@embed``, ``@attention_chunk`` and ``@mlp``,
        compiled on the first prefill (library paths)."""
        import fusionc
        from fusionc.models.prefill import CHUNK, chunk_attention_block
        key = max(chunk or CHUNK, CHUNK, self.batch)
        if key not in self._chunked:
            c = self.cfg
            attn = chunk_attention_block(
                hidden=c.hidden, heads=c.heads, kv_heads=c.kv_heads, head_dim=c.head_dim,
                max_seq=self.max_seq, eps=c.eps, theta=c.theta, dtype=self.dtype,
                qk_norm=c.qk_norm, rope_scaling=c.rope_scaling, qkv_bias=c.qkv_bias)
            self._chunked[key] = {"embed": fusionc.compile(self.ends, "embed", max_batch=key),
                                  "attention": fusionc.compile(attn, max_batch=key),
                                  "mlp": fusionc.compile(self.module, "mlp", max_batch=key)}
        return self._chunked[key]

    def _embed(self, tokens: np.ndarray, chunk: int | None = None):
        """The hidden states ``[rows, hidden]`` of token ids ``tokens`` (graph ``@embed``)."""
        import cupy
        (x,) = self._chunk_graphs(chunk)["embed"](embed=self.embed,
                                                        tokens=cupy.asarray(tokens, cupy.int32))
        return x

    def _chunk_layers(self, x, seq_of, positions, chunk: int | None = None):
        """Every layer for the rows of one chunk (graphs ``@attention_chunk``, ``@mlp``); the
        KV caches are written in place. A full chunk (``chunk`` rows) replays the captured
        pass of that length (:mod:`fusionc.models.chunk_capture`; captured on the first one),
        on :attr:`stream` in order with the caller's stream; a shorter one runs eagerly."""
        import cupy

        from fusionc.models.chunk_capture import ChunkGraph
        from fusionc.models.prefill import CHUNK
        g = self._chunk_graphs(chunk)
        if len(seq_of) != (chunk or CHUNK):
            return self._eager(g, x, seq_of, positions)
        caller = cupy.cuda.get_current_stream()
        self.stream.wait_event(caller.record())   # x is ready; the last replay's rows copied
        cap = self._captures.get(len(seq_of))
        if cap is None:
            cap = ChunkGraph(lambda *a: self._layers(g, *a), x, seq_of, positions,
                             self.stream)
            out, cap.first = cap.first, None
            self._captures[len(seq_of)] = cap if cap.graph is not None else False
        elif cap is False:   # the capture failed: this length runs eagerly
            with self.stream:
                out = self._eager(g, x, seq_of, positions)
        else:
            out = cap.run(x, seq_of, positions)
        caller.wait_event(self.stream.record())
        return out

    def _eager(self, g, x, seq_of, positions):
        """:meth:`_layers` uncaptured, from host ``seq_of`` / ``positions``."""
        import cupy
        host = {"positions": np.asarray(positions, np.int32),
                "seq_of": np.asarray(seq_of, np.int32)}
        return self._layers(g, x, cupy.asarray(host["seq_of"]), cupy.asarray(host["positions"]),
                            host)

    def _layers(self, g, x, seq_of, positions, host):
        """The layers' graphs over one chunk (device ``seq_of`` / ``positions``, their host
        copies in ``host`` for chunk_attention's checks)."""
        from fusionc.runtime.library_attention import host_mirrors
        attn, mlp = g["attention"], g["mlp"]
        run = {"seq_of": seq_of, "positions": positions}
        with host_mirrors(*((run[k], host[k]) for k in run)):   # no copy back per layer
            for w in self.layers:
                x, _, _ = attn(x=x, **_pick(w, attn.params, "x"), **run)
                (x,) = mlp(x=x, **_pick(w, mlp.params, "x"))
        return x

    def _logits(self, x):
        """Graph ``@head`` of hidden states ``[batch, hidden]`` into :attr:`logits`."""
        self.head_graph(x=x, final_norm=self.final_norm, lm_head=self.lm_head,
                        outputs={_out(self.head_graph): self.logits})
        return self.logits

    def _capture(self):
        """Run the step once eagerly (loads the kernels), then capture it; the capture does not
        execute. Every buffer of the step is allocated beforehand: an allocation during the
        capture (its address would be baked into the graph and later reused) is an error."""
        import cupy
        self._run()
        self.stream.begin_capture()
        try:
            with cupy.cuda.using_allocator(_no_allocation):
                self._run()
        except BaseException:
            try:
                self.stream.end_capture()
            except Exception:  # noqa: S110 - the original error is the one to report
                pass
            raise
        return self.stream.end_capture()

    def replay(self) -> None:
        """Replay the captured step with the inputs of the last :meth:`step` (asynchronous, on
        :attr:`stream`): for timing a decode step without host work."""
        if self._graph is None:
            raise InputError("no decode step captured yet", valid="call step() first")
        with self.stream:
            self._graph.launch(self.stream)

    def _run(self) -> None:
        """Embedding, every layer's attention and MLP kernels, final norm and LM head (the
        captured step)."""
        a, b = self.x
        self.embed_graph(embed=self.embed, tokens=self.tokens,
                         outputs={_out(self.embed_graph): b})
        attn_out, mlp_out = _out(self.attention), _out(self.mlp)
        for w in self.layers:
            self.attention(x=b, **_pick(w, self.attention.params, "x"),
                           positions=self.positions, seq_lens=self.seq_lens,
                           outputs={attn_out: a})
            self.mlp(x=a, **_pick(w, self.mlp.params, "x"), outputs={mlp_out: b})
        self.head_graph(x=b, final_norm=self.final_norm, lm_head=self.lm_head,
                        outputs={_out(self.head_graph): self.logits})

    def _check(self, tokens, positions):
        t, p = token_ids(tokens, "tokens"), token_ids(positions, "positions")
        if t.shape != (self.batch,) or p.shape != (self.batch,):
            raise InputError(f"{t.size} tokens and {p.size} positions",
                             valid=f"{self.batch} of each (the decoder's batch)")
        if t.min() < 0 or t.max() >= self.cfg.vocab:
            raise InputError(f"token ids {t.tolist()}", valid=f"0 <= id < {self.cfg.vocab}")
        if p.min() < 0 or p.max() >= self.max_seq:
            raise InputError(f"positions {p.tolist()}",
                             valid=f"0 <= position < max_seq = {self.max_seq}")
        return t.astype(np.int32), p.astype(np.int32)


def token_ids(x, what: str) -> np.ndarray:
    """``x`` (integers: a list, numpy or CuPy array) as a flat int64 numpy array; InputError
    for non-integers or values beyond int64."""
    x = x.get() if type(x).__module__.startswith("cupy") else x
    try:
        a = np.asarray(x)
        if a.dtype.kind not in "iu" and a.size:
            raise TypeError(a.dtype)
        return a.astype(np.int64).reshape(-1)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{what} {x!r:.80}", valid="integers (token ids, positions)") from None


def check_gpu_support(cfg: ModelConfig) -> None:
    """Raise CompileError when the fused GPU kernels cannot run model ``cfg`` yet: Qwen2's bias
    on the q, k and v projections (the CPU path, :class:`~fusionc.models.HostDecoder` or
    ``fusionc generate --cpu``, runs it)."""
    if cfg.qkv_bias:
        raise CompileError(f"{cfg.arch} model: the q, k and v projections have a bias "
                           "(qkv_bias), which the fused GPU attention kernel does not take yet",
                           op="linear", valid="Llama or Qwen3 models on the GPU; Qwen2 / "
                           "Qwen2.5 on the CPU path for now (fusionc generate --cpu, "
                           "fusionc.models.HostDecoder)")


def _positive(name: str, v) -> int:
    if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
        raise InputError(f"{name} = {v!r}", valid=f"a positive integer {name}")
    return int(v)


def _no_allocation(size: int):
    """CuPy allocator in force while a decode step is captured."""
    raise CompileError(f"a {size}-byte allocation while capturing the decode step",
                       valid="every buffer of the step allocated before the capture")


def _out(graph) -> str:
    """The name of a compiled graph's first output."""
    return graph.host.outputs[0].name


def _pick(w: dict, names: list[str], *skip: str) -> dict:
    """The graph's weight and cache arguments from a layer's dict."""
    return {n: w[n] for n in names if n in w and n not in skip}
