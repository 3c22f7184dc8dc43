"""A Llama 2 7B decoder layer under tensor parallelism 2: one rank's graph (decode step).

Column-parallel QKV and gate/up, row-parallel O and down (Megatron-LM, Shoeybi et al. 2019, §3):
each rank holds 16 of the 32 heads and half of the 11008 intermediate rows. After the O
projection, ``h = x + all_reduce(o)`` and the MLP's RMSNorm become one
``all_reduce_add_rms_norm`` (pass ``fuse-allreduce-norm``; TokenWeave, arXiv 2505.11329); the
layer ends with ``all_reduce_add``. The collectives run over NVLink peer-to-peer between the
ranks' GPUs (``fusionc.comm``).

    fusionc ir examples/tp2_llama_layer.py --passes fuse-allreduce-norm
    fusionc compile examples/tp2_llama_layer.py -o out/     # kernels, collectives, simulator
    fusionc launch -n 2 -- python3 -m fusionc run examples/tp2_llama_layer.py --graph layer \
        --batch 4
    fusionc launch -n 2 -- python3 -m fusionc run examples/tp2_llama_layer.py --graph o_proj \
        --batch 4096 [--split-tokens 1]     # prefill-sized: cuBLAS + token-split overlap

``scripts/tp2_check.py`` checks the two-rank decode step against the single-GPU layer
(``fusionc.models.blocks`` attention + MLP graphs) with weights sharded by
``fusionc.models.tp.shard_layer``.
"""
import fusionc as fc
from fusionc.ir import Module
from fusionc.models.blocks import tp_layer_block, tp_oproj_block


def build(hidden: int = 4096, heads: int = 32, kv_heads: int = 32, head_dim: int = 128,
          intermediate: int = 11008, tp: int = 2, max_seq: int = 4096, eps: float = 1e-5,
          theta: float = 10000.0, dtype: str = "f16", collective: bool = True) -> Module:
    """The module with graphs ``@layer`` (one rank's shard of the TP layer, decode step) and
    ``@o_proj`` (its output projection + all-reduce + residual + RMSNorm for many tokens;
    ``collective=False`` drops the all-reduce: the no-communication baseline)."""
    return fc.module(
        tp_layer_block(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                       intermediate=intermediate, tp=tp, max_seq=max_seq, eps=eps,
                       theta=theta, dtype=dtype),
        tp_oproj_block(hidden=hidden, heads=heads, head_dim=head_dim, tp=tp, eps=eps,
                       dtype=dtype, collective=collective))


if __name__ == "__main__":
    from fusionc.ir import print_module
    print(print_module(build()), end="")
