"""Lowering of graph-IR decoder stages to tile-IR cluster kernels (used by partition-cluster).

- :mod:`.builder`: a small API to emit tile ops with fresh names and inferred types;
- :mod:`.match`: finds attention and MLP blocks in a graph (by dataflow, not by model name);
- :mod:`.attention`: the per-CTA tile program of an attention block (MLP blocks and other
  linears: :mod:`.linear_v2`; MLA blocks: :mod:`.mla_v2`; design v2);
- :mod:`.collectives`: the smem_store / barrier / collective / barrier idiom.
"""
