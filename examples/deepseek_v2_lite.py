"""DeepSeek-V2-Lite: the multi-head latent attention (MLA) block of one decoder layer, decode step.

Sizes (DeepSeek-AI 2024, "DeepSeek-V2", arXiv 2405.04434, §2.1 and appendix; Hugging Face
deepseek-ai/DeepSeek-V2-Lite): hidden 2048, 16 heads, qk_nope_head_dim 128, qk_rope_head_dim 64,
v_head_dim 128, kv_lora_rank 512, no query compression (q_lora_rank null), RMSNorm eps 1e-6,
bf16. The softmax scale is 1/sqrt(128 + 64); the released checkpoint's YaRN RoPE scaling (and
its mscale on the softmax scale) is not modelled.

Decode in the weight-absorbed form (the paper's appendix C; FlashMLA): the cache holds, per
token, the normalized latent c_KV (512) and the RoPE key k_R (64, interleaved pairs), one
``[B, max_seq, 576]`` tensor; W_UK is absorbed into the query and W_UV applied to the latent
attention output. Weights as the model's tensors rearranged on load: ``w_uk_t[h] = W_UK_hᵀ``
(``[heads, 512, 128]``) and ``w_uv[h] = W_UV_h`` (``[heads, 128, 512]``), both from kv_b_proj.

    fusionc ir examples/deepseek_v2_lite.py
"""
import math

import fusionc as fc
from fusionc.ir import Module


def attention_block(*, hidden: int, heads: int, qk_nope: int, qk_rope: int, v_head: int,
                    kv_lora: int, max_seq: int, eps: float, theta: float, dtype: str,
                    q_lora: int = 0) -> Module:
    """Graph ``@attention``: x + o_proj(W_UV · MLA(q, cache)) with the cache appended.
    ``q_lora > 0``: the query is compressed (DeepSeek-V3; arXiv 2405.04434 eqs. 12-13):
    q = w_q_b · rms_norm(w_q_a · h, q_a_norm), transformers' q_a_proj, q_a_layernorm and
    q_b_proj, in place of w_q."""
    T = fc.dtype(dtype)
    q_head = qk_nope + qk_rope

    def rest(x, h, q, w_kv_a, kv_norm, w_uk_t, w_uv, w_o, cache, positions, seq_lens):
        q = fc.split_heads(q, heads, name="q_heads")
        q_nope, q_rope = fc.split(q, [qk_nope, qk_rope], name=("q_nope", "q_pe"))
        q_rope = fc.rope(q_rope, positions, theta, style="gptj", name="q_rot")
        c, k_rope = fc.split(fc.linear(h, w_kv_a, name="kv_a"), [kv_lora, qk_rope],
                             name=("c", "k_pe"))
        c = fc.rms_norm(c, kv_norm, eps, name="c_kv")
        k_rope = fc.rope(fc.split_heads(k_rope, 1), positions, theta, style="gptj")
        cache = fc.latent_cache_append(cache, c, fc.merge_heads(k_rope, name="k_rot"), positions)
        q_latent = fc.head_linear(q_nope, w_uk_t, name="q_latent")    # W_UK absorbed
        o_latent = fc.mla_decode_attention(q_latent, q_rope, cache, seq_lens,
                                           1 / math.sqrt(q_head), name="o_latent")
        o = fc.head_linear(o_latent, w_uv, name="o")                   # W_UV applied
        out = x + fc.linear(fc.merge_heads(o, name="o_flat"), w_o, name="o_proj")
        return out, cache

    if q_lora:
        @fc.graph
        def attention(x: T["B", hidden], attn_norm: T[hidden], w_q_a: T[q_lora, hidden],
                      q_a_norm: T[q_lora], w_q_b: T[heads * q_head, q_lora],
                      w_kv_a: T[kv_lora + qk_rope, hidden], kv_norm: T[kv_lora],
                      w_uk_t: T[heads, kv_lora, qk_nope], w_uv: T[heads, v_head, kv_lora],
                      w_o: T[hidden, heads * v_head], cache: T["B", max_seq, kv_lora + qk_rope],
                      positions: fc.i32["B"], seq_lens: fc.i32["B"]):
            h = fc.rms_norm(x, attn_norm, eps, name="h")
            q_a = fc.rms_norm(fc.linear(h, w_q_a, name="q_a"), q_a_norm, eps, name="q_a_n")
            q = fc.linear(q_a, w_q_b, name="q")
            return rest(x, h, q, w_kv_a, kv_norm, w_uk_t, w_uv, w_o, cache, positions,
                        seq_lens)
        return attention

    @fc.graph
    def attention(x: T["B", hidden], attn_norm: T[hidden], w_q: T[heads * q_head, hidden],
                  w_kv_a: T[kv_lora + qk_rope, hidden], kv_norm: T[kv_lora],
                  w_uk_t: T[heads, kv_lora, qk_nope], w_uv: T[heads, v_head, kv_lora],
                  w_o: T[hidden, heads * v_head], cache: T["B", max_seq, kv_lora + qk_rope],
                  positions: fc.i32["B"], seq_lens: fc.i32["B"]):
        h = fc.rms_norm(x, attn_norm, eps, name="h")
        q = fc.linear(h, w_q, name="q")
        return rest(x, h, q, w_kv_a, kv_norm, w_uk_t, w_uv, w_o, cache, positions, seq_lens)

    return attention


def build(hidden: int = 2048, heads: int = 16, qk_nope: int = 128, qk_rope: int = 64,
          v_head: int = 128, kv_lora: int = 512, max_seq: int = 4096, eps: float = 1e-6,
          theta: float = 10000.0, dtype: str = "bf16", q_lora: int = 0) -> Module:
    """The module with graph ``@attention`` of a DeepSeek-V2-Lite layer (``q_lora = 1536``,
    ``heads = 128``, ``hidden = 7168``: a DeepSeek-V3 layer's attention)."""
    return fc.module(attention_block(hidden=hidden, heads=heads, qk_nope=qk_nope,
                                     qk_rope=qk_rope, v_head=v_head, kv_lora=kv_lora,
                                     max_seq=max_seq, eps=eps, theta=theta, dtype=dtype,
                                     q_lora=q_lora))


if __name__ == "__main__":
    from fusionc.ir import print_module
    print(print_module(build()), end="")
