"""Prompts in chunks: the attention graph for T new tokens of any sequences
(``@attention_chunk``) and the chunk plan of a batch of prompts.

Row t of a chunk is token ``positions[t]`` of sequence ``seq_of[t]``: its K and V go into that
sequence's cache (``kv_cache_write``), then it attends over the sequence's cache up to its own
position (``chunk_attention``: causal within the chunk). The MLP graph of decoding takes the
chunk's rows as they are. A prompt of n tokens then costs ⌈n / chunk⌉ passes over the weights
instead of n decode steps.
"""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import math
import numbers

import numpy as np

import fusionc as fc
from fusionc.errors import InputError
from fusionc.ir import Module
from fusionc.models.blocks import qkv_heads

CHUNK = 256   # new tokens per pass (issue 25: up to 256 rows per call)


def chunk_attention_block(*, hidden: int, heads: int, kv_heads: int, head_dim: int,
                          max_seq: int, eps: float, theta: float, dtype: str,
                          qk_norm: bool = False, rope_scaling=(), qkv_bias: bool = False
                          ) -> Module:
    """Graph ``@attention_chunk``: :func:`fusionc.models.blocks.attention_block` for rows that
    are new tokens of the cache's sequences — x ``[T, hidden]``, ``positions`` and ``seq_of``
    ``i32[T]``, caches ``[N, max_seq, kv_heads, head_dim]`` (N sequences). Same weights.
    Returns the new hidden states and the updated caches."""
    T = fc.dtype(dtype)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    cache = T["N", max_seq, kv_heads, head_dim]
    sizes = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, eps=eps, theta=theta,
                 qk_norm=qk_norm, rope_scaling=rope_scaling)

    def attend(x, norms, w_qkv, w_o, k_cache, v_cache, positions, seq_of, bias=None):
        q, k, v = qkv_heads(x, w_qkv, norms, positions, bias, **sizes)
        k_cache, v_cache = fc.kv_cache_write(k_cache, v_cache, k, v, seq_of, positions)
        o = fc.chunk_attention(q, k_cache, v_cache, seq_of, positions, 1 / math.sqrt(head_dim),
                               name="o")
        return x + fc.linear(fc.merge_heads(o, name="o_flat"), w_o, name="o_proj"), \
            k_cache, v_cache

    wq = T[q_size + 2 * kv_size, hidden]
    if qk_norm:
        @fc.graph
        def attention_chunk(x: T["T", hidden], attn_norm: T[hidden], w_qkv: wq,
                            q_norm: T[head_dim], k_norm: T[head_dim], w_o: T[hidden, q_size],
                            k_cache: cache, v_cache: cache, positions: fc.i32["T"],
                            seq_of: fc.i32["T"]):
            return attend(x, (attn_norm, q_norm, k_norm), w_qkv, w_o, k_cache, v_cache,
                          positions, seq_of)
    elif qkv_bias:
        @fc.graph
        def attention_chunk(x: T["T", hidden], attn_norm: T[hidden], w_qkv: wq,
                            qkv_bias: T[q_size + 2 * kv_size], w_o: T[hidden, q_size],
                            k_cache: cache, v_cache: cache, positions: fc.i32["T"],
                            seq_of: fc.i32["T"]):
            return attend(x, (attn_norm,), w_qkv, w_o, k_cache, v_cache, positions, seq_of,
                          qkv_bias)
    else:
        @fc.graph
        def attention_chunk(x: T["T", hidden], attn_norm: T[hidden], w_qkv: wq,
                            w_o: T[hidden, q_size], k_cache: cache, v_cache: cache,
                            positions: fc.i32["T"], seq_of: fc.i32["T"]):
            return attend(x, (attn_norm,), w_qkv, w_o, k_cache, v_cache, positions, seq_of)
    return attention_chunk


def tp_chunk_layer_block(*, hidden: int, heads: int, kv_heads: int, head_dim: int,
                         intermediate: int, tp: int, max_seq: int, eps: float, theta: float,
                         dtype: str, rope_scaling=()) -> Module:
    """Graph ``@layer_chunk``: one rank's shard of a decoder layer
    (:func:`fusionc.models.blocks.tp_layer_block`) for the rows of a chunk — x ``[T, hidden]``,
    ``positions`` and ``seq_of`` ``i32[T]``, this rank's caches ``[N, max_seq, kv_heads/tp,
    head_dim]``; same weights. Returns the new hidden states and the caches. Sizes as
    :func:`~fusionc.models.tp.check_tp` allows (ValueError otherwise, from the decode form)."""
    from fusionc.models.blocks import tp_layer_block, tp_tail
    tp_layer_block(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                   intermediate=intermediate, tp=tp, max_seq=max_seq, eps=eps, theta=theta,
                   dtype=dtype, rope_scaling=rope_scaling)   # checks the sizes
    T = fc.dtype(dtype)
    hq, hkv, ish = heads // tp, kv_heads // tp, intermediate // tp
    q_size, kv_size = hq * head_dim, hkv * head_dim
    cache = T["N", max_seq, hkv, head_dim]
    sizes = dict(heads=hq, kv_heads=hkv, head_dim=head_dim, eps=eps, theta=theta,
                 rope_scaling=rope_scaling)

    @fc.graph
    def layer_chunk(x: T["T", hidden], attn_norm: T[hidden],
                    w_qkv: T[q_size + 2 * kv_size, hidden], w_o: T[hidden, q_size],
                    k_cache: cache, v_cache: cache, positions: fc.i32["T"],
                    seq_of: fc.i32["T"], mlp_norm: T[hidden], w_gate_up: T[2 * ish, hidden],
                    w_down: T[hidden, ish]):
        q, k, v = qkv_heads(x, w_qkv, (attn_norm,), positions, **sizes)
        k_cache, v_cache = fc.kv_cache_write(k_cache, v_cache, k, v, seq_of, positions)
        o = fc.chunk_attention(q, k_cache, v_cache, seq_of, positions, 1 / math.sqrt(head_dim),
                               name="o")
        return tp_tail(x, o, w_o, mlp_norm, w_gate_up, w_down, tp=tp, eps=eps), k_cache, \
            v_cache
    return layer_chunk


def chunks(lengths, start, chunk: int = CHUNK):
    """The passes of a batch of prompts: sequence b has ``lengths[b]`` new tokens from position
    ``start[b]``; each pass is ``(seq_of, positions, offsets)`` of at most ``chunk`` rows,
    sequences in order, a sequence's rows consecutive (``offsets``: the row's index within its
    prompt). InputError for negative lengths or a chunk < 1."""
    if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or chunk < 1:
        raise InputError(f"chunk = {chunk!r}", valid="a positive number of rows per pass")
    rows = [(b, int(start[b]) + i, i) for b, n in enumerate(lengths) for i in range(int(n))]
    if any(int(n) < 0 for n in lengths):
        raise InputError(f"prompt lengths {list(map(int, lengths))}", valid="lengths >= 0")
    out = []
    for c in range(0, len(rows), chunk):
        part = np.array(rows[c:c + chunk], np.int64).reshape(-1, 3)
        out.append((part[:, 0].astype(np.int32), part[:, 1].astype(np.int32), part[:, 2]))
    return out


def prompt_ids(prompts, batch: int, max_seq: int, vocab: int) -> list[np.ndarray]:
    """One int64 array of token ids per sequence; InputError unless there are ``batch``
    non-empty prompts of at most ``max_seq`` ids in ``[0, vocab)``."""
    from fusionc.models.decoder import token_ids
    if isinstance(prompts, (dict, str, bytes, set)) or not hasattr(prompts, "__len__"):
        raise InputError(f"prompts {prompts!r:.80}", valid=f"a list of {batch} lists of token "
                                                           "ids (one per sequence)")
    try:
        seqs = [token_ids(q, "prompt") for q in prompts]
    except TypeError:
        raise InputError(f"prompts {prompts!r:.80}", valid=f"{batch} lists of token ids")
    if len(seqs) != batch or any(not 0 < len(q) <= max_seq for q in seqs):
        raise InputError(f"prompts of lengths {[len(q) for q in seqs]}",
                         valid=f"{batch} prompts (one per sequence) of 1 to {max_seq} ids")
    bad = next((b for b, q in enumerate(seqs) if q.min() < 0 or q.max() >= vocab), None)
    if bad is not None:
        raise InputError(f"token ids of prompt {bad}: {seqs[bad].tolist()!r:.80}",
                         valid=f"0 <= id < {vocab}")
    return seqs
