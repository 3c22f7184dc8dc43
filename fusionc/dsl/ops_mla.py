"""DSL ops of multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, §2.1; the ops'
definitions are in :mod:`fusionc.ir.ops.mla`)."""
from __future__ import annotations

from fusionc.dsl.builder import emit
from fusionc.dsl.tensor import Tracer


def head_linear(x: Tracer, w: Tracer, *, name: str | None = None) -> Tracer:
    """One linear map per head: ``y[b, h, n] = Σ_k x[b, h, k] · w[h, n, k]`` (fp32 sums).

    MLA uses it to absorb W_UK into the query (``w`` = W_UK per head, transposed to
    ``[heads, latent, qk_nope]``) and to expand the latent attention output by W_UV
    (``[heads, v_head, latent]``).

    Args:
        x: ``[B, heads, in]``; w: ``[heads, out, in]``, same float dtype.
    Returns:
        ``[B, heads, out]``.
    """
    return emit("head_linear", (x, w), name=name)[0]


def latent_cache_append(cache: Tracer, c: Tracer, k_rope: Tracer, positions: Tracer, *,
                        name: str | None = None) -> Tracer:
    """Write each row's latent ``c`` and RoPE key ``k_rope`` into the MLA cache at its position:
    ``cache[b, positions[b]] = [c[b] ; k_rope[b]]``. Returns the updated cache (in place on the
    GPU; return it from the graph).

    Args:
        cache: ``[B, max_seq, latent + rope]``; c: ``[B, latent]``; k_rope: ``[B, rope]``.
        positions: ``i32[B]``, each in ``[0, max_seq)``.
    """
    if name is None and isinstance(cache, Tracer):
        name = cache.name
    return emit("latent_cache_append", (cache, c, k_rope, positions), name=name)[0]


def mla_decode_attention(q_latent: Tracer, q_rope: Tracer, cache: Tracer, seq_lens: Tracer,
                         scale: float, *, name: str | None = None) -> Tracer:
    """Decode attention over the MLA cache, weight-absorbed form:
    ``s_t = scale · (q_latent · c_t + q_rope · k_rope_t)``, ``o = Σ_{t<n} softmax(s)_t · c_t``
    with n = seq_lens[b] (DeepSeek-V2, §2.1.2-2.1.3, appendix C), fp32 accumulation.

    Args:
        q_latent: ``[B, heads, latent]`` (W_UKᵀ q_nope); q_rope: ``[B, heads, rope]``.
        cache: ``[B, max_seq, latent + rope]``; seq_lens: ``i32[B]``.
        scale: DeepSeek-V2: 1/sqrt(qk_nope_head_dim + qk_rope_head_dim).
    Returns:
        ``[B, heads, latent]``, the latent attention output (expand with W_UV).
    """
    return emit("mla_decode_attention", (q_latent, q_rope, cache, seq_lens), {"scale": scale},
                name)[0]
