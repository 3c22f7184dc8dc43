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

The blocks are written in the DSL in ``fusionc/models/blocks.py`` (``attention_block``,
``mlp_block``: functions with the sizes as parameters), which the model front
(``fusionc generate``) builds every layer from; ``llama3_8b.py`` and ``qwen3_qk_norm.py`` call
them with other sizes.
"""
import fusionc as fc
from fusionc.ir import Module
from fusionc.models.blocks import attention_block, mlp_block


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
