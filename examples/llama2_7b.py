"""Llama 2 7B: the attention block and the MLP block of one decoder layer, decode step.

Sizes (Touvron et al. 2023, "Llama 2"; Hugging Face meta-llama/Llama-2-7b-hf): hidden 4096,
32 heads × 128 (MHA: 32 KV heads), intermediate 11008, RMSNorm eps 1e-5, RoPE theta 10000 in
the NeoX (half split) layout of the Hugging Face weights, fp16.

``B`` is the symbolic batch: one new token per sequence. Runtime inputs besides the weights:
``positions[b]`` (where the new token's K and V go in the cache, and its RoPE position) and
``seq_lens[b]`` (tokens attended over, usually positions[b] + 1). KV cache layout
``[B, max_seq, kv_heads, head_dim]``.

    fusionc ir examples/llama2_7b.py                      # print the IR
    fusionc ir examples/llama2_7b.py -D hidden=256 -D heads=2 -D intermediate=512

The blocks are built by functions with the sizes as parameters; ``llama3_8b.py`` and
``qwen3_qk_norm.py`` reuse them.
"""
import math

import fusionc as fc
from fusionc.ir import Module


def attention_block(*, hidden: int, heads: int, kv_heads: int, head_dim: int, max_seq: int,
                    eps: float, theta: float, dtype: str) -> Module:
    """Graph ``@attention``: x + o_proj(attention(rope(qkv_proj(rms_norm(x))))).

    Weights: fused QKV ``[(heads + 2·kv_heads)·head_dim, hidden]`` (q rows, then k, then v),
    output projection ``[hidden, heads·head_dim]``. Returns the new hidden state and the updated
    KV caches.
    """
    T = fc.dtype(dtype)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    cache = T["B", max_seq, kv_heads, head_dim]

    @fc.graph
    def attention(x: T["B", hidden], attn_norm: T[hidden], w_qkv: T[q_size + 2 * kv_size, hidden],
                  w_o: T[hidden, q_size], k_cache: cache, v_cache: cache,
                  positions: fc.i32["B"], seq_lens: fc.i32["B"]):
        h = fc.rms_norm(x, attn_norm, eps, name="h")
        qkv = fc.linear(h, w_qkv, name="qkv")
        q, k, v = fc.split(qkv, [q_size, kv_size, kv_size], name=("q", "k", "v"))
        q = fc.rope(fc.split_heads(q, heads, name="q_heads"), positions, theta, name="q_rot")
        k = fc.rope(fc.split_heads(k, kv_heads, name="k_heads"), positions, theta, name="k_rot")
        v = fc.split_heads(v, kv_heads, name="v_heads")
        k_cache, v_cache = fc.kv_cache_append(k_cache, v_cache, k, v, positions)
        o = fc.decode_attention(q, k_cache, v_cache, seq_lens, 1 / math.sqrt(head_dim), name="o")
        out = x + fc.linear(fc.merge_heads(o, name="o_flat"), w_o, name="o_proj")
        return out, k_cache, v_cache

    return attention


def mlp_block(*, hidden: int, intermediate: int, eps: float, dtype: str) -> Module:
    """Graph ``@mlp``: x + down(silu(gate(h)) · up(h)) with h = rms_norm(x) (SwiGLU MLP).

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


def build(hidden: int = 4096, heads: int = 32, head_dim: int = 128, intermediate: int = 11008,
          max_seq: int = 4096, eps: float = 1e-5, theta: float = 10000.0,
          dtype: str = "f16") -> Module:
    """The module with graphs ``@attention`` and ``@mlp`` of a Llama 2 7B layer (MHA)."""
    return fc.module(
        attention_block(hidden=hidden, heads=heads, kv_heads=heads, head_dim=head_dim,
                        max_seq=max_seq, eps=eps, theta=theta, dtype=dtype),
        mlp_block(hidden=hidden, intermediate=intermediate, eps=eps, dtype=dtype))


if __name__ == "__main__":
    from fusionc.ir import print_module
    print(print_module(build()), end="")
