"""Lowering of graph-IR blocks to tile-IR kernels of design v2.

- :mod:`.builder`: a small API to emit tile ops with fresh names and inferred types;
- :mod:`.match_v2`, :mod:`.linear_v2`: linear layers and the ops around them (MLP blocks) as
  streamed kernels;
- :mod:`.attention_v2`: an attention block's core as one attention-units kernel;
- :mod:`.mla_v2`, :mod:`.match_heads`: MLA blocks (the MLA units, block-diagonal head linears).
"""
