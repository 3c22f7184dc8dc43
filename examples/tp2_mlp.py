"""Tensor-parallel SwiGLU MLP of Llama 2 7B over ``tp`` GPUs (default 2), one rank's graph.

Megatron-style sharding (Shoeybi et al. 2019, "Megatron-LM", §3): the gate and up projections
are column-parallel — rank r holds rows ``[r·s, (r+1)·s)`` of each, s = intermediate / tp, so
its fused ``w_gate_up`` is [gate rows of r; up rows of r] — and the down projection is
row-parallel — rank r holds columns ``[r·s, (r+1)·s)`` of ``w_down``. Each rank computes a
partial down projection; ``all_reduce`` sums the partials over the group; the residual add
follows. The input x and the norm weight are replicated.

This AllReduce → add is the pattern TokenWeave (arXiv 2505.11329) overlaps and fuses.

    fusionc ir examples/tp2_mlp.py
    fusionc ir examples/tp2_mlp.py -D tp=4
    fusionc launch -n 2 -- python3 -m fusionc run examples/tp2_mlp.py --batch 4       # decode
    fusionc launch -n 2 -- python3 -m fusionc run examples/tp2_mlp.py --batch 4096    # prefill:
        # cuBLAS GEMMs, token-split overlap of the all-reduce (--split-tokens 1: no split)
"""
import fusionc as fc
from fusionc.ir import Module


def build(hidden: int = 4096, intermediate: int = 11008, tp: int = 2, eps: float = 1e-5,
          dtype: str = "f16", collective: bool = True) -> Module:
    """The module with graph ``@mlp``: one rank's shard of a tensor-parallel MLP
    (``collective=False``: the same computation without the all-reduce, the baseline of
    token-split overlap)."""
    if intermediate % tp:
        raise ValueError(f"intermediate = {intermediate} is not a multiple of tp = {tp}")
    T, shard = fc.dtype(dtype), intermediate // tp

    @fc.graph
    def mlp(x: T["B", hidden], mlp_norm: T[hidden], w_gate_up: T[2 * shard, hidden],
            w_down: T[hidden, shard]):
        h = fc.rms_norm(x, mlp_norm, eps, name="h")
        gate, up = fc.split(fc.linear(h, w_gate_up, name="gate_up"), [shard, shard],
                            name=("gate", "up"))
        partial = fc.linear(fc.silu_mul(gate, up, name="act"), w_down, name="partial")
        return x + (fc.all_reduce(partial, group=tp, name="down") if collective else partial)

    return fc.module(mlp)


if __name__ == "__main__":
    from fusionc.ir import print_module
    print(print_module(build()), end="")
