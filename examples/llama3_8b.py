"""Llama 3 8B: attention (GQA) and MLP blocks of one decoder layer, decode step.

Sizes (Llama Team 2024, "The Llama 3 Herd of Models", Table 3; Hugging Face
meta-llama/Meta-Llama-3-8B): hidden 4096, 32 query heads and 8 KV heads × 128 (GQA groups of
4: query head h reads KV head h // 4), intermediate 14336, RMSNorm eps 1e-5, RoPE theta 500000
(NeoX layout), bf16. Llama 3.1's long-context RoPE frequency scaling is the ``rope_scaling``
argument of ``attention_block`` (``fusionc generate`` reads it from config.json).

The block structure is Llama 2's (``llama2_7b.py``); only the sizes differ.

    fusionc ir examples/llama3_8b.py
"""
import fusionc as fc
from fusionc.ir import Module
from fusionc.models.blocks import attention_block, mlp_block


def build(hidden: int = 4096, heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
          intermediate: int = 14336, max_seq: int = 8192, eps: float = 1e-5,
          theta: float = 500000.0, dtype: str = "bf16") -> Module:
    """The module with graphs ``@attention`` (GQA) and ``@mlp`` of a Llama 3 8B layer."""
    return fc.module(
        attention_block(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                        max_seq=max_seq, eps=eps, theta=theta, dtype=dtype),
        mlp_block(hidden=hidden, intermediate=intermediate, eps=eps, dtype=dtype))


if __name__ == "__main__":
    from fusionc.ir import print_module
    print(print_module(build()), end="")
