"""Token-split overlap (TokenWeave, Gond, Kwatra, Ramjee 2025, arXiv 2505.11329, §4) and
library calls.

token_split: ``x [B, ...]`` → ``parts`` row blocks ``[B.0, ...]``, ``[B.1, ...]``, … (views on
the GPU). The sizes come from :func:`split_sizes` at run time, the same on every rank and for
every token_split of a graph with the same attributes, and bind the symbols ``B.i``.

token_concat: the blocks back into ``[B, ...]`` (in order).

library_call: an op run by a library instead of a fusionc kernel; ``fn = cublas_gemm`` is
``linear`` (``y = x · wᵀ (+ bias)``, fp32 accumulation, rounded to the dtype of x or to
``out_dtype``) as one cuBLAS GEMM
(``cublasGemmEx``) — the GEMM-class layer for many tokens (prefill, large batches).
"""
from __future__ import annotations

import numpy as np

from fusionc.ir.ops import linear as _linear
from fusionc.ir.ops.common import io_cost
from fusionc.ir.registry import (
    FLOAT_DTYPES_TEXT,
    NONNEG_INT,
    POS_INT,
    OpDef,
    attr,
    enum,
    fail,
    register,
)
from fusionc.ir.types import FLOAT_DTYPES

# Row-wise graph ops: split-tokens may cut them into token blocks, and the runtime runs them
# outside fusionc kernels (cuBLAS, row kernels, the collectives).
HOST_ROWWISE = frozenset({"library_call", "head_linear", "rms_norm", "silu_mul", "add", "mul",
                          "silu", "cast", "split", "all_reduce",
                          "all_reduce_add", "all_reduce_add_rms_norm"})
# What the library path runs besides them: gathers of table rows by token id, heads as views,
# and a prompt chunk's RoPE, KV-cache write and attention (fusionc.runtime.library_attention).
CHUNK_OPS = frozenset({"rope", "kv_cache_write", "chunk_attention"})
# A decode step's attention ops that the attention units do not take, on the mixed path's host
# (the same library kernels).
HOST_DECODE = frozenset({"rope", "kv_cache_append", "decode_attention"})
LIBRARY_OPS = HOST_ROWWISE | CHUNK_OPS | HOST_DECODE | frozenset({"embedding", "reshape"})

SPLIT_ATTRS = (
    attr("parts", POS_INT, doc="number of row blocks"),
    attr("min_tokens", NONNEG_INT, 1024, doc="below this many tokens: no split (one block)"),
    attr("tile", POS_INT, 128, doc="GEMM tile rows (M)"),
    attr("n_tiles", POS_INT, 1, doc="GEMM tile columns of the widest GEMM of the graph"),
    attr("sms", POS_INT, 132, doc="streaming multiprocessors (H100/H200 SXM: 132)"),
)


MAX_PARTS = 64


def split_sizes(tokens: int, parts: int, min_tokens: int = 1024, tile: int = 128,
                n_tiles: int = 1, sms: int = 132) -> list[int]:
    """Rows of each block: wave-aware.

    A GEMM over ``s`` rows runs ``ceil(s / tile) · n_tiles`` CTAs (tiles), in waves of ``sms``.
    Blocks are whole waves where possible: the granule is ``g = floor(sms / n_tiles) · tile``
    rows (the most M-tiles that fit one wave) when every block still gets at least two granules
    — then no block but the last ends in a partial wave — else ``tile`` (tile boundaries only);
    each block but the last gets ``round(tokens / parts / granule)`` granules (at least one),
    the last block the rest (blocks past the tokens are empty).
    TokenWeave's rule for comparison (its code): pad T to a multiple of 256, split at
    ``T_pad / 2 + offset`` with an offset in {0, 128, 256} tuned per token bucket; both split on
    GEMM-tile boundaries, this one from the wave size instead of a tuned offset.
    Below ``min_tokens`` (or with fewer tokens than blocks × tile) the last block takes all:
    its collective runs on the compute stream, as without a split (empty blocks are skipped).

    Returns: ``parts`` sizes summing to ``tokens``.
    Raises:
        InputError: a negative token count, or parts, tile, n_tiles, sms outside their ranges.
    """
    ints = (tokens, parts, min_tokens, tile, n_tiles, sms)
    if any(isinstance(v, bool) or not isinstance(v, int) for v in ints) or tokens < 0 or \
            min_tokens < 0 or not 1 <= parts <= MAX_PARTS or min(tile, n_tiles, sms) < 1:
        from fusionc.errors import InputError
        raise InputError(f"split_sizes{ints}", op="token_split",
                         valid=f"integers: tokens, min_tokens >= 0; 1 <= parts <= {MAX_PARTS}; "
                               "tile, n_tiles, sms >= 1")
    if parts == 1 or tokens < max(min_tokens, parts * tile):
        return [0] * (parts - 1) + [tokens]
    per_wave = max(1, sms // n_tiles) * tile
    granule = per_wave if tokens >= 2 * parts * per_wave else tile
    size = max(1, round(tokens / parts / granule)) * granule
    sizes = [min(size, max(0, tokens - i * size)) for i in range(parts - 1)]
    return sizes + [tokens - sum(sizes)]


def part_symbol(sym: str, i: int) -> str:
    """The symbol of block ``i`` of symbolic dim ``sym`` (``B`` → ``B.0``)."""
    return f"{sym}.{i}"


def _infer_split(op):
    if op.attr("parts") > MAX_PARTS:
        fail(op, f"parts = {op.attr('parts')}", f"1 to {MAX_PARTS} blocks")
    t = op.operands[0].type
    if t.rank < 1 or not isinstance(t.shape[0], str):
        fail(op, f"x has type {t}", "[B, ...] with a symbolic token dim B")
    return tuple(t.with_shape((part_symbol(t.shape[0], i),) + t.shape[1:])
                 for i in range(op.attr("parts")))


def _run_split(op, args, ctx):
    x = args[0]
    sizes = split_sizes(x.shape[0], **{a.name: op.attr(a.name) for a in SPLIT_ATTRS})
    from fusionc.runtime.host_ops import bind_blocks
    bind_blocks(ctx.env, op.operands[0].type.shape[0], sizes, op)
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=0))


def _infer_concat(op):
    ts = [v.type for v in op.operands]
    if not ts:
        fail(op, "no blocks", "the blocks [B.0, ...], [B.1, ...], ... of one token_split")
    first = ts[0]
    syms = [t.shape[0] if t.rank else None for t in ts]
    base = syms[0].rsplit(".", 1)[0] if isinstance(syms[0], str) and "." in syms[0] else None
    want = [part_symbol(base, i) for i in range(len(ts))] if base else None
    if want is None or syms != want or any(t.shape[1:] != first.shape[1:] or
                                           t.dtype != first.dtype for t in ts):
        fail(op, f"blocks {', '.join(map(str, ts))}", "the blocks [B.0, ...], [B.1, ...], ... "
             "of one token_split, in order")
    return (first.with_shape((base,) + first.shape[1:]),)


def _verify_concat(op, graph, module) -> None:
    """The blocks are every result of one token_split, in order (or of the ops that the
    split-tokens pass repeated per block: then they carry the symbols B.0 … B.(n-1) of a
    token_split with n parts)."""
    base = op.operands[0].type.shape[0].rsplit(".", 1)[0]
    splits = {o.attrs for o in graph.body if o.name == "token_split"
              and o.operands[0].type.shape[0] == base}
    if len(splits) != 1:
        fail(op, f"{len(splits)} different token_splits of {base}",
             f"exactly one kind of token_split of {base} (same attributes) in the graph")
    parts = dict(next(iter(splits)))["parts"]
    if len(op.operands) != parts:
        fail(op, f"{len(op.operands)} blocks of {base}",
             f"all {parts} blocks of the token_split of {base}")


def _run_concat(op, args, ctx):
    return (np.concatenate(args, axis=0),)


def _infer_call(op):
    x = op.operands[0].type
    if x.dtype not in FLOAT_DTYPES:
        fail(op, f"x has dtype {x.dtype}", FLOAT_DTYPES_TEXT)
    return _linear._infer(op)


register(OpDef("token_split", __doc__, ("x",), SPLIT_ATTRS, _infer_split,
               interpret=_run_split, cost=io_cost))
register(OpDef("token_concat", __doc__, ("blocks*",), (), _infer_concat,
               interpret=_run_concat, cost=io_cost, verify=_verify_concat))
register(OpDef("library_call", __doc__, ("x", "w", "bias?"),
               (attr("fn", enum("cublas_gemm"), doc="the library function"), _linear.OUT_DTYPE),
               _infer_call,
               interpret=_linear._run, cost=_linear._cost))
