"""Qwen3 4B: attention with QK-norm, and the MLP block of one decoder layer, decode step.

Qwen3 applies an RMSNorm to every query and key head (over head_dim, one weight vector shared
by all heads) after the QKV projection and before RoPE (Qwen Team 2025, "Qwen3 Technical
Report", §2; Hugging Face Qwen/Qwen3-4B: ``q_norm``, ``k_norm``). Sizes: hidden 2560, 32 query
heads and 8 KV heads × 128 — so heads × head_dim = 4096 ≠ hidden —, intermediate 9728,
RMSNorm eps 1e-6, RoPE theta 1000000 (NeoX layout), bf16. ``max_seq`` (KV cache capacity) is a
deployment choice.

This graph is not Llama's: it must compile without a model-specific template.

    fusionc ir examples/qwen3_qk_norm.py
"""
import math

from llama2_7b import mlp_block

import fusionc as fc
from fusionc.ir import Module


def attention_block(*, hidden: int, heads: int, kv_heads: int, head_dim: int, max_seq: int,
                    eps: float, theta: float, dtype: str) -> Module:
    """Graph ``@attention``: Llama's attention block with rms_norm on each q and k head."""
    T = fc.dtype(dtype)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    cache = T["B", max_seq, kv_heads, head_dim]

    @fc.graph
    def attention(x: T["B", hidden], attn_norm: T[hidden],
                  w_qkv: T[q_size + 2 * kv_size, hidden], q_norm: T[head_dim],
                  k_norm: T[head_dim], w_o: T[hidden, q_size], k_cache: cache, v_cache: cache,
                  positions: fc.i32["B"], seq_lens: fc.i32["B"]):
        h = fc.rms_norm(x, attn_norm, eps, name="h")
        q, k, v = fc.split(fc.linear(h, w_qkv, name="qkv"), [q_size, kv_size, kv_size],
                           name=("q", "k", "v"))
        q, k = fc.split_heads(q, heads, name="q_heads"), fc.split_heads(k, kv_heads, name="k_heads")
        q = fc.rms_norm(q, q_norm, eps, name="q_normed")   # QK-norm: per head, over head_dim
        k = fc.rms_norm(k, k_norm, eps, name="k_normed")
        q = fc.rope(q, positions, theta, name="q_rot")
        k = fc.rope(k, positions, theta, name="k_rot")
        v = fc.split_heads(v, kv_heads, name="v_heads")
        k_cache, v_cache = fc.kv_cache_append(k_cache, v_cache, k, v, positions)
        o = fc.decode_attention(q, k_cache, v_cache, seq_lens, 1 / math.sqrt(head_dim), name="o")
        out = x + fc.linear(fc.merge_heads(o, name="o_flat"), w_o, name="o_proj")
        return out, k_cache, v_cache

    return attention


def build(hidden: int = 2560, heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
          intermediate: int = 9728, max_seq: int = 8192, eps: float = 1e-6,
          theta: float = 1000000.0, dtype: str = "bf16") -> Module:
    """The module with graphs ``@attention`` (QK-norm, GQA) and ``@mlp`` of a Qwen3 4B layer."""
    return fc.module(
        attention_block(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                        max_seq=max_seq, eps=eps, theta=theta, dtype=dtype),
        mlp_block(hidden=hidden, intermediate=intermediate, eps=eps, dtype=dtype))


if __name__ == "__main__":
    from fusionc.ir import print_module
    print(print_module(build()), end="")
