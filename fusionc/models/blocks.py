"""The decoder blocks of Llama-family models in the fusionc DSL: one attention block and one MLP
block per layer, decode step (one new token per sequence), and the step's ends (:func:`step_ends`:
the embedding, the final norm and the LM head).

``B`` is the symbolic batch. Runtime inputs besides the weights: ``positions[b]`` (where the new
token's K and V go in the cache, and its RoPE position) and ``seq_lens[b]`` (tokens attended
over, usually positions[b] + 1). KV cache layout ``[B, max_seq, kv_heads, head_dim]``.

Llama 2/3: Touvron et al. 2023, "Llama 2"; Llama Team 2024, "The Llama 3 Herd of Models".
Qwen3 (``qk_norm``): Qwen Team 2025, "Qwen3 Technical Report", §2 — an RMSNorm over head_dim on
every query and key head (one weight vector shared by the heads) before RoPE. Qwen2 / Qwen2.5
(``qkv_bias``): Qwen Team 2024, "Qwen2 Technical Report", §2.1 — a bias on the q, k and v
projections (none on the output projection). RoPE uses the NeoX (half split) layout of the
Hugging Face weights.
"""

import math  # no `from __future__ import annotations`: the DSL evaluates the annotations

import fusionc as fc
from fusionc.ir import Module


def attention_block(*, hidden: int, heads: int, kv_heads: int, head_dim: int, max_seq: int,
                    eps: float, theta: float, dtype: str, qk_norm: bool = False,
                    rope_scaling=(), qkv_bias: bool = False) -> Module:
    """Graph ``@attention``: x + o_proj(attention(rope(qkv_proj(rms_norm(x))))).

    Weights: fused QKV ``[(heads + 2·kv_heads)·head_dim, hidden]`` (q rows, then k, then v),
    output projection ``[hidden, heads·head_dim]``; with ``qk_norm`` also ``q_norm`` and
    ``k_norm`` ``[head_dim]``; with ``qkv_bias`` the fused bias ``qkv_bias`` of the QKV rows
    (Qwen2). ``rope_scaling``: Llama 3.1's frequency scaling (``fusionc.ir.ops.rope``).
    Returns the new hidden state and the updated KV caches. Raises ValueError for
    ``qk_norm`` with ``qkv_bias`` (no model has both).
    """
    if qk_norm and qkv_bias:
        raise ValueError("qk_norm with qkv_bias: no supported model has both")
    T = fc.dtype(dtype)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    cache = T["B", max_seq, kv_heads, head_dim]
    sizes = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, eps=eps, theta=theta,
                 qk_norm=qk_norm, rope_scaling=rope_scaling)

    def heads_of(x, w_qkv, norms, positions, bias=None):
        return qkv_heads(x, w_qkv, norms, positions, bias, **sizes)

    def attend(x, q, k, v, w_o, k_cache, v_cache, positions, seq_lens):
        k_cache, v_cache = fc.kv_cache_append(k_cache, v_cache, k, v, positions)
        o = fc.decode_attention(q, k_cache, v_cache, seq_lens, 1 / math.sqrt(head_dim), name="o")
        out = x + fc.linear(fc.merge_heads(o, name="o_flat"), w_o, name="o_proj")
        return out, k_cache, v_cache

    if qk_norm:
        @fc.graph
        def attention(x: T["B", hidden], attn_norm: T[hidden],
                      w_qkv: T[q_size + 2 * kv_size, hidden], q_norm: T[head_dim],
                      k_norm: T[head_dim], w_o: T[hidden, q_size], k_cache: cache,
                      v_cache: cache, positions: fc.i32["B"], seq_lens: fc.i32["B"]):
            q, k, v = heads_of(x, w_qkv, (attn_norm, q_norm, k_norm), positions)
            return attend(x, q, k, v, w_o, k_cache, v_cache, positions, seq_lens)
    elif qkv_bias:
        @fc.graph
        def attention(x: T["B", hidden], attn_norm: T[hidden],
                      w_qkv: T[q_size + 2 * kv_size, hidden], qkv_bias: T[q_size + 2 * kv_size],
                      w_o: T[hidden, q_size], k_cache: cache, v_cache: cache,
                      positions: fc.i32["B"], seq_lens: fc.i32["B"]):
            q, k, v = heads_of(x, w_qkv, (attn_norm,), positions, qkv_bias)
            return attend(x, q, k, v, w_o, k_cache, v_cache, positions, seq_lens)
    else:
        @fc.graph
        def attention(x: T["B", hidden], attn_norm: T[hidden],
                      w_qkv: T[q_size + 2 * kv_size, hidden], w_o: T[hidden, q_size],
                      k_cache: cache, v_cache: cache, positions: fc.i32["B"],
                      seq_lens: fc.i32["B"]):
            q, k, v = heads_of(x, w_qkv, (attn_norm,), positions)
            return attend(x, q, k, v, w_o, k_cache, v_cache, positions, seq_lens)
    return attention


def qkv_heads(x, w_qkv, norms, positions, bias=None, *, heads: int, kv_heads: int,
              head_dim: int, eps: float, theta: float, qk_norm: bool = False, rope_scaling=()):
    """The attention's front for rows x ``[rows, hidden]``: RMSNorm (``norms[0]``), the fused
    QKV projection (+ ``bias``), heads, QK-norm (``norms[1:]``, Qwen3) and RoPE at
    ``positions``; returns q ``[rows, heads, head_dim]``, k and v ``[rows, kv_heads,
    head_dim]``."""
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    h = fc.rms_norm(x, norms[0], eps, name="h")
    qkv = fc.linear(h, w_qkv, bias, name="qkv")
    q, k, v = fc.split(qkv, [q_size, kv_size, kv_size], name=("q", "k", "v"))
    q, k = fc.split_heads(q, heads, name="q_heads"), fc.split_heads(k, kv_heads, name="k_heads")
    if qk_norm:  # QK-norm: per head, over head_dim
        q = fc.rms_norm(q, norms[1], eps, name="q_normed")
        k = fc.rms_norm(k, norms[2], eps, name="k_normed")
    q = fc.rope(q, positions, theta, scaling=rope_scaling, name="q_rot")
    k = fc.rope(k, positions, theta, scaling=rope_scaling, name="k_rot")
    return q, k, fc.split_heads(v, kv_heads, name="v_heads")


def mlp_block(*, hidden: int, intermediate: int, eps: float, dtype: str) -> Module:
    """Graph ``@mlp``: x + down(silu(gate(h)) · up(h)) with h = rms_norm(x) (SwiGLU MLP,
    Shazeer 2020, "GLU Variants Improve Transformer").

    Weights: fused gate/up ``[2·intermediate, hidden]`` (gate rows, then up rows), down
    ``[hidden, intermediate]``.
    """
    T = fc.dtype(dtype)

    @fc.graph
    def mlp(x: T["B", hidden], mlp_norm: T[hidden], w_gate_up: T[2 * intermediate, hidden],
            w_down: T[hidden, intermediate]):
        h = fc.rms_norm(x, mlp_norm, eps, name="h")
        gate_up = fc.linear(h, w_gate_up, name="gate_up")
        gate, up = fc.split(gate_up, [intermediate, intermediate], name=("gate", "up"))
        act = fc.silu_mul(gate, up, name="act")
        return x + fc.linear(act, w_down, name="down")

    return mlp


def layer_module(cfg, max_seq: int, dtype: str | None = None) -> Module:
    """The module with graphs ``@attention`` and ``@mlp`` of one decoder layer of model config
    ``cfg`` (:class:`fusionc.models.config.ModelConfig`); every layer shares these graphs."""
    return fc.module(
        attention_block(hidden=cfg.hidden, heads=cfg.heads, kv_heads=cfg.kv_heads,
                        head_dim=cfg.head_dim, max_seq=max_seq, eps=cfg.eps, theta=cfg.theta,
                        dtype=dtype or cfg.dtype, qk_norm=cfg.qk_norm,
                        rope_scaling=cfg.rope_scaling, qkv_bias=cfg.qkv_bias),
        mlp_block(hidden=cfg.hidden, intermediate=cfg.intermediate, eps=cfg.eps,
                  dtype=dtype or cfg.dtype))


def step_ends(cfg, dtype: str | None = None) -> Module:
    """The graphs around the layers of a decode step of model config ``cfg``:

    - ``@embed(embed [vocab, hidden], tokens i32[B]) -> x [B, hidden]``: the token rows;
    - ``@head(x [B, hidden], final_norm [hidden], lm_head [vocab, hidden]) -> logits f32[B,
      vocab]``: the final RMSNorm (rounded to the dtype, as every block's output) and the LM
      head with fp32 sums unrounded (``out_dtype = f32``). Tied embeddings pass the embedding
      table as ``lm_head``.
    """
    from fusionc.errors import InputError
    from fusionc.models.config import ModelConfig
    if not isinstance(cfg, ModelConfig):
        raise InputError(f"step_ends({cfg!r:.60})", valid="a fusionc.models.ModelConfig "
                         "(fusionc.models.load_config)")
    T = fc.dtype(dtype or cfg.dtype)
    hidden, vocab = cfg.hidden, cfg.vocab

    @fc.graph
    def embed(embed: T[vocab, hidden], tokens: fc.i32["B"]):
        return fc.embedding(embed, tokens, name="x")

    @fc.graph
    def head(x: T["B", hidden], final_norm: T[hidden], lm_head: T[vocab, hidden]):
        h = fc.rms_norm(x, final_norm, cfg.eps, name="normed")
        return fc.linear(h, lm_head, out_dtype=fc.f32, name="logits")

    return fc.module(embed, head)


def tp_layer_block(*, hidden: int, heads: int, kv_heads: int, head_dim: int,
                   intermediate: int, tp: int, max_seq: int, eps: float, theta: float,
                   dtype: str, rope_scaling=()) -> Module:
    """Graph ``@layer``: one rank's shard of a whole decoder layer under tensor parallelism
    ``tp`` (Megatron-LM, Shoeybi et al. 2019, §3): column-parallel QKV (this rank's
    ``heads/tp`` query heads and ``kv_heads/tp`` KV heads) and gate/up (``intermediate/tp``
    rows each), row-parallel O and down projections whose partial sums ``all_reduce`` adds.

    ``h = x + all_reduce(o_proj)`` followed by the MLP's RMSNorm is the pattern pass
    ``fuse-allreduce-norm`` turns into one ``all_reduce_add_rms_norm``; the layer's end
    ``h + all_reduce(down)`` becomes ``all_reduce_add``.

    Weights of rank r: ``w_qkv`` = [q rows of r; k rows of r; v rows of r] of the full fused QKV,
    ``w_o`` = columns of r's heads, ``w_gate_up`` = [gate rows of r; up rows of r], ``w_down`` =
    columns of r's intermediate slice; norms replicated. Returns the new hidden state and this
    rank's KV caches ``[B, max_seq, kv_heads/tp, head_dim]``.

    Raises:
        ValueError: tp not a positive integer, or heads, kv_heads or intermediate not
            divisible by it.
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp = {tp!r} is not a positive integer")
    for name, n in (("heads", heads), ("kv_heads", kv_heads), ("intermediate", intermediate)):
        if n % tp:
            raise ValueError(f"{name} = {n} is not a multiple of tp = {tp}")
    T = fc.dtype(dtype)
    hq, hkv, ish = heads // tp, kv_heads // tp, intermediate // tp
    q_size, kv_size = hq * head_dim, hkv * head_dim
    cache = T["B", max_seq, hkv, head_dim]

    @fc.graph
    def layer(x: T["B", hidden], attn_norm: T[hidden], w_qkv: T[q_size + 2 * kv_size, hidden],
              w_o: T[hidden, q_size], k_cache: cache, v_cache: cache, positions: fc.i32["B"],
              seq_lens: fc.i32["B"], mlp_norm: T[hidden], w_gate_up: T[2 * ish, hidden],
              w_down: T[hidden, ish]):
        h0 = fc.rms_norm(x, attn_norm, eps, name="h0")
        q, k, v = fc.split(fc.linear(h0, w_qkv, name="qkv"), [q_size, kv_size, kv_size],
                           name=("q", "k", "v"))
        q = fc.rope(fc.split_heads(q, hq, name="q_heads"), positions, theta,
                    scaling=rope_scaling, name="q_rot")
        k = fc.rope(fc.split_heads(k, hkv, name="k_heads"), positions, theta,
                    scaling=rope_scaling, name="k_rot")
        k_cache, v_cache = fc.kv_cache_append(k_cache, v_cache, k,
                                              fc.split_heads(v, hkv, name="v_heads"), positions)
        o = fc.decode_attention(q, k_cache, v_cache, seq_lens, 1 / math.sqrt(head_dim),
                                name="o")
        return tp_tail(x, o, w_o, mlp_norm, w_gate_up, w_down, tp=tp, eps=eps), k_cache, \
            v_cache

    return layer


def tp_tail(x, o, w_o, mlp_norm, w_gate_up, w_down, *, tp: int, eps: float):
    """A TP layer after its attention ``o`` [rows, heads/tp, head_dim]: the row-parallel O
    projection, ``h = x + all_reduce(·)``, the MLP's RMSNorm, this rank's gate/up rows and
    down columns, ``h + all_reduce(down)`` (the new hidden state)."""
    ish = w_down.shape[1]
    attn = fc.linear(fc.merge_heads(o, name="o_flat"), w_o, name="o_partial")
    h = x + fc.all_reduce(attn, tp, name="o_sum")
    y = fc.rms_norm(h, mlp_norm, eps, name="y")
    gate, up = fc.split(fc.linear(y, w_gate_up, name="gate_up"), [ish, ish],
                        name=("gate", "up"))
    down = fc.linear(fc.silu_mul(gate, up, name="act"), w_down, name="down_partial")
    return h + fc.all_reduce(down, tp, name="down_sum")


def tp_oproj_block(*, hidden: int, heads: int, head_dim: int, tp: int, eps: float, dtype: str,
                   collective: bool = True) -> Module:
    """Graph ``@o_proj``: the output projection of a TP layer and what follows it, for many
    tokens — ``h = x + all_reduce(o · w_oᵀ)``, ``y = rms_norm(h)`` (the MLP's input norm);
    rank r holds the columns of w_o of its ``heads/tp`` heads. ``collective=False``: the same
    computation without the all-reduce (``h = x + o · w_oᵀ``), the baseline of overlap.
    Returns (y, h).
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or heads % tp:
        raise ValueError(f"heads = {heads} is not a multiple of tp = {tp}")
    T = fc.dtype(dtype)
    q_size = heads // tp * head_dim

    @fc.graph
    def o_proj(x: T["B", hidden], o: T["B", q_size], w_o: T[hidden, q_size],
               mlp_norm: T[hidden]):
        part = fc.linear(o, w_o, name="o_partial")
        h = x + (fc.all_reduce(part, tp, name="o_sum") if collective else part)
        return fc.rms_norm(h, mlp_norm, eps, name="y"), h

    return o_proj
