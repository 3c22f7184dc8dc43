"""Which ``head_linear`` ops run as block-diagonal design-v2 linear kernels (issue 27).

``head_linear(x, w)`` computes ``y[b, h, n] = Σ_k x[b, h, k] · w[h, n, k]``: one ``[N, K]``
matrix per head, MLA's absorbed W_UK and W_UV (DeepSeek-V2, arXiv 2405.04434, appendix C). As
a linear over the weight's row view ``[H·N, K]``, the tiles of head ``h`` read the activation
columns ``[h·C, h·C + K)`` of a ``[B, H·C]`` row view (``acc_gemv {head_rows = N, head_cols =
C}``), so the kernel streams every weight byte once over all SMs as a plain linear does.

The activations (:func:`head_kernels`) are either

- a kernel's output or a graph input ``[B, H, K]`` (``C = K``: W_UV on the latent attention
  output), or
- the first part of a per-head split of a projection's rows, ``split(reshape(Q))[0]`` with
  ``Q: [B, H·C]`` (W_UK on ``q_nope`` of ``q = [q_nope | q_pe]`` per head): the kernel reads
  ``Q`` and the views are absorbed, when every other part of the split is read by an MLA
  core only (:func:`fusionc.lower.mla_v2.mla_cores`, which reads ``Q`` itself).

The result is written as ``[B, H, N]``, or flat when its only use is the reshape to ``[B, H·N]``
(``merge_heads`` before the output projection; absorbed, so the projection chains after it).
Weights must be static graph inputs whose rows TMA copies, ``N`` a multiple of 64 (tiles
inside one head: 64-row tiles where ``N`` is no multiple of 128) and ``K`` a multiple of a
tile's columns (a tail tile would read the next head's columns against the weight's zero
fill, which is only zero while they are finite); other ``head_linear`` ops run on the host between the
kernels (:func:`fusionc.lower.mla_v2.host_ops`).
"""
from __future__ import annotations

from fusionc.ir.nodes import Graph, Op, Value, users
from fusionc.ir.types import FLOAT_DTYPES
from fusionc.lower.linear_v2 import ROWS, tile_cols
from fusionc.lower.match_v2 import LinearKernel
from fusionc.stream.ring import tma_rows


def head_kernels(g: Graph) -> dict[int, LinearKernel]:
    """The block-diagonal kernels of ``g`` (module docstring), by ``id`` of the head_linear."""
    use, outputs = users(g), {v.name for v in g.outputs}
    made = {r.name: op for op in g.body for r in op.results}
    params = {p.name for p in g.params}
    from fusionc.lower.mla_v2 import mla_cores
    in_cores = {id(o) for c in mla_cores(g) for o in c.absorbed}
    found = {}
    for op in g.body:
        if op.name == "head_linear" and _weight_ok(op, params):
            k = _activations(op, made, use, outputs, in_cores)
            if k is not None:
                _output(k, use, outputs)
                found[id(op)] = k
    return found


def _weight_ok(op: Op, params: set) -> bool:
    x, w = op.operands[0].type, op.operands[1].type
    return (op.operands[1].name in params and w.is_static and w.rank == 3 and
            x.dtype == w.dtype and x.dtype in FLOAT_DTYPES and
            w.shape[1] % ROWS == 0 and tma_rows(w.shape[2], w.dtype.itemsize) and
            w.shape[2] % tile_cols(w.dtype) == 0)   # no K tail: x's next columns are data


def _only(v: Value, use, outputs) -> Op | None:
    u = use.get(v.name, [])
    return u[0] if len(u) == 1 and v.name not in outputs else None


def _activations(op: Op, made, use, outputs, in_cores) -> LinearKernel | None:
    """The kernel with its activation source, or None (the op stays on the host)."""
    x = op.operands[0]
    src = made.get(x.name)
    if src is None or src.name not in ("split", "reshape"):   # [B, H, K] contiguous
        if tma_rows(x.type.shape[1] * x.type.shape[2], x.type.dtype.itemsize):
            return LinearKernel(op, x=x, head_cols=x.type.shape[2])
        return None
    if src.name != "split" or src.results[0].name != x.name or \
            src.attr("axis") % 3 != 2 or _only(x, use, outputs) is not op:
        return None
    rs = made.get(src.operands[0].name)
    if rs is None or rs.name != "reshape" or rs.operands[0].type.rank != 2 or \
            _only(rs.result, use, outputs) is not src:
        return None
    q = rs.operands[0]
    others = [u for r in src.results[1:] for u in use.get(r.name, [])]
    if any(r.name in outputs for r in src.results[1:]) or \
            any(id(u) not in in_cores for u in others) or \
            not tma_rows(q.type.shape[1], q.type.dtype.itemsize):
        return None
    return LinearKernel(op, x=q, head_cols=rs.result.type.shape[2], absorbed=[rs, src])


def _output(k: LinearKernel, use, outputs) -> None:
    """The kernel's output: the flat view when it is the result's only use (absorbed)."""
    y = k.linear.result
    nxt = _only(y, use, outputs)
    k.out = y
    flat = (y.type.shape[0], y.type.shape[1] * y.type.shape[2])
    if nxt is not None and nxt.name == "reshape" and nxt.result.type.shape == flat:
        k.out = nxt.result
        k.absorbed.append(nxt)
