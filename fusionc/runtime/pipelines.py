"""The default pipelines of ``fusionc.compile`` (lowering v2): the fused streamed kernels, the
mixed path (GEMMs around attention units, the rest as host row kernels) or the library path,
chosen by the batch bucket, what the fused kernels take and the cost table."""
from __future__ import annotations

from fusionc.ir.nodes import Graph


def library_pipeline(g: Graph, split_tokens: int | None = None,
                     min_split_tokens: int = 4096) -> str:
    """The library path: views folded (``fold-views``), linears as cuBLAS GEMMs
    (``lower-library``), the rest as row kernels; with collectives, the tokens cut into
    ``split_tokens`` blocks (default 2)."""
    parts = split_tokens if split_tokens is not None else (2 if _has_collectives(g) else 1)
    return (f"fold-views,fuse-allreduce-norm,split-tokens{{parts={parts},"
            f"min_tokens={min_split_tokens}}},lower-library")


def v2_default_pipeline(g: Graph, max_batch: int, split_tokens: int | None = None,
                        min_split_tokens: int = 4096) -> str:
    """``lowering = v2``'s pipeline for ``g``: fused streamed kernels
    (:func:`fusionc.passes.stream.v2_pipeline`) up to the batch bucket every linear takes
    (:func:`fusionc.lower.linear_v2.fused_rows`: 128 rows on tensor cores, 16 on the FMA
    paths), of 128-row weight tiles (chained) where every linear is on tensor cores and the
    cost table measured them fastest, unless it measured the library path fastest
    (:meth:`fusionc.cost.h200.Device.v2_path`: wide tiles at 1-32 rows, the library path from
    33 rows on an H200); the library path (:func:`library_pipeline`) otherwise, when
    ``split_tokens`` is given, or when ops are left that no fused kernel takes
    (:func:`fusionc.lower.match_v2.unfused_ops`: a graph without a linear, an elementwise op
    before a linear, a norm with other uses, an embedding) and the library path runs them all
    (``LIBRARY_OPS``; others stay on the fused pipeline, whose ``partition-units`` names
    them). Attention graphs never take the library path: past the bucket, with host ops left,
    or where the cost table measured the library path faster (33 rows and more on an H200),
    they take the mixed path (:func:`mixed_pipeline`: GEMMs around attention units), and so do
    attentions the units do not take, at any batch, on the host (``host``).
    The rows are ``max_batch`` or a static batch, whichever is larger."""
    from fusionc.cost.h200 import H200
    from fusionc.lower.linear_v2 import MAX_BATCH_MMA, fused_rows
    from fusionc.ir.ops.tokens import LIBRARY_OPS
    from fusionc.lower.match_v2 import unfused_ops
    from fusionc.passes.stream import v2_pipeline
    g = first_passes(g)   # decide on the graph the pipelines' first passes leave
    if chunk_graph(g):   # a prompt chunk's attention runs as library kernels, its linears as GEMMs
        return library_pipeline(g, split_tokens, min_split_tokens)
    top = fused_rows(g)
    rows = _rows(g, max_batch)
    left = unfused_ops(g)   # the library runs them, or partition-units names them
    runs = bool(left) and all(op.name in LIBRARY_OPS for op in left)
    path = H200.v2_path(rows)
    if any(op.name in ATTENTION_OPS for op in g.body):
        host = host_attention(g)
        if _mixed_rows(rows, top) or left or host:
            bad = _not_mixed(g)
            if bad is None:
                return mixed_pipeline(rows, host)
            if top is None or rows > top or host:
                from fusionc.errors import LoweringError
                why = "an attention the units do not take (the host runs it)" if host else \
                    f"{rows} rows (past the fused bucket)"
                raise LoweringError(f"an attention graph with {why} whose {bad.name} the "
                                    "host cannot run", op=bad.name, loc=bad.loc,
                                    valid="linears, attention blocks and row-wise float ops "
                                          "on [T, D] rows (the mixed path)" +
                                          ("" if host else f"; at most {top} rows for the "
                                           "fused kernels"))
        wide = path == "wide" and top == MAX_BATCH_MMA
        return path_pipeline(g, max_batch, "wide" if wide else "fused", None)
    if top is not None and (rows > top or path == "library") or \
            split_tokens is not None or runs:
        return library_pipeline(g, split_tokens, min_split_tokens)
    if path == "wide" and top == MAX_BATCH_MMA:
        return path_pipeline(g, max_batch, "wide", True)
    return v2_pipeline(max_batch)


def path_pipeline(g: Graph, max_batch: int, path: str, chain: bool | None,
                  fuse: bool = False) -> str:
    """The pipeline of lowering v2's ``path`` (``fusionc.cost.h200.Device.v2_path``'s names:
    fused 64-row tiles, wide 128-row tiles, the library path; or ``mixed``: GEMMs around
    attention units); ``chain`` as
    :func:`fusionc.passes.stream.v2_pipeline`'s; ``fuse``: on a fused path, attention blocks
    in one kernel (``partition-units{attention_o=true}``)."""
    from fusionc.lower.linear_v2 import ROWS, WIDE_ROWS
    from fusionc.passes.stream import v2_pipeline
    if path == "library":
        return library_pipeline(g)
    if path == "mixed":
        return mixed_pipeline(_rows(g, max_batch), host=host_attention(first_passes(g)))
    out = v2_pipeline(max_batch, chain=chain, rows=WIDE_ROWS if path == "wide" else ROWS)
    return out.replace("}", ", attention_o=true}", 1) if fuse else out


def host_attention(g: Graph) -> bool:
    """Whether ``g`` (views folded: :func:`first_passes`) has a ``decode_attention`` that the
    attention units do not take (:func:`fusionc.lower.attention_v2.covers`): the mixed path
    runs it on the host (``attention-units{host=true}``), and no fused path takes ``g``."""
    from fusionc.lower.attention_v2 import covers
    return any(op.name == "decode_attention" for op in g.body) and not covers(g)


def first_passes(g: Graph) -> Graph:
    """``g`` after the first passes of every v2 pipeline: ``fold-views``, then
    ``fuse-allreduce-norm`` (a tensor-parallel layer's ``rms_norm(x + all_reduce(o))`` as one
    collective, whose normed output the next linear reads without a prologue)."""
    from fusionc.passes.fold_views import fold_views
    from fusionc.passes.fuse_allreduce_norm import FuseAllReduceNorm
    return FuseAllReduceNorm().rewrite(fold_views(g))


def _mixed_rows(rows: int, top: int | None) -> bool:
    """Whether an attention graph of ``rows`` rows takes the mixed path when the host can run
    the rest: past the fused bucket ``top`` (None: a linear no fused kernel takes), or where
    the cost table measured the library path faster (33 rows and more on an H200)."""
    from fusionc.cost.h200 import H200
    return top is None or rows > top or H200.v2_path(rows) == "library"


def mixed(g: Graph) -> bool:
    """Whether the mixed path runs graph ``g`` (views folded): linears as GEMMs, each attention
    core on the units, and besides them only host row-wise ops (``HOST_ROWWISE``) on float
    operands, norms over rows ``[T, D]``, and the attentions the units do not take (RoPE, KV
    append and decode attention: ``fusionc.runtime.library_attention``)."""
    return _not_mixed(g) is None


def _not_mixed(g: Graph):
    """The first op of ``g`` the mixed path cannot run on the host, or None."""
    from fusionc.ir.ops.tokens import HOST_DECODE, HOST_ROWWISE
    from fusionc.ir.types import FLOAT_DTYPES
    from fusionc.lower.attention_v2 import host_rest
    for op in host_rest(g):
        if op.name == "reshape":   # heads split or merged around W_UK and W_UV: views
            continue
        if op.name in HOST_DECODE and op.operands[0].type.dtype in FLOAT_DTYPES:
            continue   # library_attention's kernels (rope over [T, heads, D])
        if op.name not in HOST_ROWWISE or \
                any(v.type.dtype not in FLOAT_DTYPES for v in op.operands) or \
                op.name == "rms_norm" and op.operands[0].type.rank != 2:
            return op
    return None


def mixed_pipeline(max_batch: int, host: bool = False) -> str:
    """The mixed path: views folded, the attention cores as ``attn_units`` kernels
    (``attention-units``), the linears as cuBLAS GEMMs and the rest as row kernels
    (``lower-library``); ``host``: attentions the units do not take as the host's library
    kernels (``attention-units{host=true}``)."""
    opts = f"max_batch={max_batch}" + (",host=true" if host else "")
    return f"fold-views,fuse-allreduce-norm,attention-units{{{opts}}},lower-library"


def _rows(g: Graph, max_batch: int) -> int:
    """``max_batch`` or a linear's or attention's static batch, whichever is larger."""
    return max([max_batch] + [op.operands[0].type.shape[0] for op in g.body
                              if (op.name, op.operands[0].type.rank) in
                              (("linear", 2), ("decode_attention", 3)) and
                              isinstance(op.operands[0].type.shape[0], int)])


ATTENTION_OPS = frozenset({"decode_attention", "mla_decode_attention"})


def chunk_graph(g: Graph) -> bool:
    """Whether ``g`` attends new tokens over their sequences' caches (``chunk_attention``:
    ``fusionc/models/prefill.py``)."""
    return any(op.name == "chunk_attention" for op in g.body)


def _has_collectives(g: Graph) -> bool:
    from fusionc.ir.ops.comm import host_collective
    return any(host_collective(op) for op in g.body)
