"""DSL ops specific to decoder attention and tensor parallelism: RoPE, KV cache, decode
attention, all-reduce.

Layouts: per-token head vectors ``[B, heads, head_dim]``; KV cache ``[B, max_seq, kv_heads,
head_dim]`` (row b of the batch is one sequence; token t of it at ``cache[b, t]``); positions
and lengths ``i32[B]``. ``B`` is the symbolic batch (number of decode tokens).
"""
from __future__ import annotations

import math

from fusionc.dsl.builder import emit
from fusionc.dsl.source import user_loc
from fusionc.dsl.tensor import Tracer
from fusionc.errors import DSLError


def rope(x: Tracer, positions: Tracer, theta: float, style: str = "neox",
         rotary_dim: int | None = None, scaling=(), *, name: str | None = None) -> Tracer:
    """Rotary position embedding (Su et al. 2021, "RoFormer", eq. 34).

    For pair i < rotary_dim/2 at position p: θ_i = theta^(−2i/rotary_dim), a = p·θ_i (fp32),
    (x1, x2) → (x1·cos a − x2·sin a, x2·cos a + x1·sin a), where the pair is
    (x[i], x[i + rotary_dim/2]) for ``style="neox"`` (GPT-NeoX, Hugging Face Llama) or
    (x[2i], x[2i+1]) for ``style="gptj"`` (GPT-J, interleaved). Dims from rotary_dim on are
    copied unchanged.

    Args:
        x: ``[B, heads, head_dim]``, float dtype.
        positions: ``i32[B]``, the position of each row's new token.
        theta: frequency base (Llama 2: 10000, Llama 3: 500000, Qwen3: 1000000).
        style: ``"neox"`` or ``"gptj"``.
        rotary_dim: even, <= head_dim; None means head_dim.
        scaling: ``[factor, low_freq_factor, high_freq_factor, original_max_position]`` for
            Llama 3.1's frequency scaling (``fusionc.ir.ops.rope``), or empty for none.
    Returns:
        ``[B, heads, head_dim]``, dtype of x.
    """
    if rotary_dim is None:
        rotary_dim = x.shape[-1] if isinstance(x, Tracer) and x.ndim else None
    return emit("rope", (x, positions),
                {"theta": theta, "style": style, "rotary_dim": rotary_dim,
                 "scaling": tuple(scaling)}, name)[0]


def kv_cache_append(k_cache: Tracer, v_cache: Tracer, k: Tracer, v: Tracer,
                    positions: Tracer, *, name=None) -> tuple[Tracer, Tracer]:
    """Write each row's new key and value into the caches at its position.

    ``k_cache[b, positions[b]] = k[b]`` and likewise for v; returns the updated caches (updated
    in place on the GPU; return them from the graph so that the update is an output).

    Args:
        k_cache, v_cache: ``[B, max_seq, kv_heads, head_dim]``.
        k, v: ``[B, kv_heads, head_dim]``, dtype of the caches.
        positions: ``i32[B]``, each in ``[0, max_seq)``.
    Returns:
        (k_cache, v_cache) after the write; named after the inputs (``%k_cache.1``) unless
        ``name`` is given.
    """
    if name is None and isinstance(k_cache, Tracer) and isinstance(v_cache, Tracer):
        name = (k_cache.name, v_cache.name)
    kc, vc = emit("kv_cache_append", (k_cache, v_cache, k, v, positions), name=name)
    return kc, vc


def decode_attention(q: Tracer, k_cache: Tracer, v_cache: Tracer, seq_lens: Tracer,
                     scale: float | None = None, *, name: str | None = None) -> Tracer:
    """Attention of one new query token per row over its cached keys and values (MHA, GQA).

    For row b with n = seq_lens[b]: s_t = scale · q_h · k_t, o_h = Σ_{t<n} softmax(s)_t · v_t
    (Vaswani et al. 2017, eq. 1), accumulated in fp32. Query head h reads KV head
    h // (heads / kv_heads) (GQA, Ainslie et al. 2023). A row with n = 0 yields zeros; cache
    entries at t >= n are never read.

    Args:
        q: ``[B, heads, head_dim]``.
        k_cache, v_cache: ``[B, max_seq, kv_heads, head_dim]``, heads a multiple of kv_heads.
        seq_lens: ``i32[B]``, each in ``[0, max_seq]``.
        scale: softmax scale; None means 1/sqrt(head_dim).
    Returns:
        ``[B, heads, head_dim]``, dtype of q.
    """
    if scale is None:
        scale = _default_scale(q, "decode_attention", "B")
    return emit("decode_attention", (q, k_cache, v_cache, seq_lens), {"scale": scale}, name)[0]


def _default_scale(q, op: str, rows: str) -> float:
    """1/sqrt(head_dim) of q ``[rows, heads, head_dim]``; DSLError without a static head_dim."""
    d = q.shape[-1] if isinstance(q, Tracer) and q.ndim else None
    if not isinstance(d, int):
        raise DSLError(f"cannot derive the scale from q {getattr(q, 'type', q)}", op=op,
                       loc=user_loc(),
                       valid=f"q: [{rows}, heads, head_dim] with a static head_dim, or scale=")
    return 1.0 / math.sqrt(d)


def kv_cache_write(k_cache: Tracer, v_cache: Tracer, k: Tracer, v: Tracer, seq_of: Tracer,
                   positions: Tracer, *, name=None) -> tuple[Tracer, Tracer]:
    """Write T new tokens' keys and values, of any sequences, into the caches.

    ``k_cache[seq_of[t], positions[t]] = k[t]`` and likewise for v (a prompt's chunk: the rows
    of one sequence consecutive at consecutive positions, checked when the graph runs).

    Args:
        k_cache, v_cache: ``[B, max_seq, kv_heads, head_dim]``.
        k, v: ``[T, kv_heads, head_dim]``, dtype of the caches.
        seq_of: ``i32[T]``, each in ``[0, B)``; positions: ``i32[T]``, each in ``[0, max_seq)``.
    Returns:
        (k_cache, v_cache) after the write; named after the inputs unless ``name`` is given.
    """
    if name is None and isinstance(k_cache, Tracer) and isinstance(v_cache, Tracer):
        name = (k_cache.name, v_cache.name)
    kc, vc = emit("kv_cache_write", (k_cache, v_cache, k, v, seq_of, positions), name=name)
    return kc, vc


def chunk_attention(q: Tracer, k_cache: Tracer, v_cache: Tracer, seq_of: Tracer,
                    positions: Tracer, scale: float | None = None, *,
                    name: str | None = None) -> Tracer:
    """Attention of T new tokens, each over its sequence's cache up to its own position.

    Row t reads ``cache[seq_of[t], 0 .. positions[t]]``: after :func:`kv_cache_write` of the
    chunk this is causal attention within it (Vaswani et al. 2017, eq. 1; GQA as
    :func:`decode_attention`), accumulated in fp32.

    Args:
        q: ``[T, heads, head_dim]``; k_cache, v_cache: ``[B, max_seq, kv_heads, head_dim]``.
        seq_of, positions: ``i32[T]`` (see :func:`kv_cache_write`).
        scale: softmax scale; None means 1/sqrt(head_dim).
    Returns:
        ``[T, heads, head_dim]``, dtype of q.
    """
    if scale is None:
        scale = _default_scale(q, "chunk_attention", "T")
    return emit("chunk_attention", (q, k_cache, v_cache, seq_of, positions), {"scale": scale},
                name)[0]


def all_reduce(x: Tracer, group: int, scope: str = "nvlink", *,
               name: str | None = None) -> Tracer:
    """Sum of x over the ``group`` ranks of a tensor-parallel group; every rank gets the sum.

    Used after a row-parallel linear layer (Shoeybi et al. 2019, "Megatron-LM", §3): each rank
    holds a partial product, the all-reduce completes it. Accumulated in fp32, rounded to the
    dtype of x. x: any shape, float dtype. Returns the same type. ``scope``: ``"nvlink"`` (the
    GPUs of one node, peer-to-peer) or ``"nccl"`` (beyond one node). Followed by a residual add
    and an RMSNorm, the pass ``fuse-allreduce-norm`` turns the three into one
    ``all_reduce_add_rms_norm``.
    """
    return emit("all_reduce", (x,), {"group": group, "scope": scope}, name)[0]
