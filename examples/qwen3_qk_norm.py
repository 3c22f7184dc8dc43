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
import fusionc as fc
from fusionc.ir import Module
from fusionc.models.blocks import attention_block, mlp_block


def build(hidden: int = 2560, heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
          intermediate: int = 9728, max_seq: int = 8192, eps: float = 1e-6,
          theta: float = 1000000.0, dtype: str = "bf16") -> Module:
    """The module with graphs ``@attention`` (QK-norm, GQA) and ``@mlp`` of a Qwen3 4B layer."""
    return fc.module(
        attention_block(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                        max_seq=max_seq, eps=eps, theta=theta, dtype=dtype, qk_norm=True),
        mlp_block(hidden=hidden, intermediate=intermediate, eps=eps, dtype=dtype))


if __name__ == "__main__":
    from fusionc.ir import print_module
    print(print_module(build()), end="")
