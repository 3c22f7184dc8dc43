"""Tensor-parallel communication: all_reduce, and all_reduce fused with the residual add and
RMSNorm that follow it.

all_reduce: y = Σ_r x_r over the ``group`` ranks of a tensor-parallel group; every rank receives
the sum (accumulated in fp32, rounded to the dtype of x). Groups are consecutive ranks
``[group·k, group·k + group)``; the interpreter sums in rank order. ``scope`` says how the ranks
are connected: ``nvlink`` (GPUs of one node, peer-to-peer loads and stores over NVLink) or
``nccl`` (beyond one node, through NCCL).
"""
from __future__ import annotations

import math

import numpy as np

from fusionc.interp.numerics import round_to
from fusionc.ir.ops.common import io_cost
from fusionc.ir.ops.norm import rms_norm_values
from fusionc.ir.registry import (FLOAT, FLOAT_DTYPES_TEXT, NONNEG_INT, POS_INT, OpDef, attr,
                                 enum, fail, register, same_dtype)
from fusionc.ir.types import FLOAT_DTYPES

SCOPE = enum("nvlink", "nccl")
STREAM = attr("stream", NONNEG_INT, 0, omit=True,
              doc="0: the compute stream; 1: the communication stream of token-split overlap")


def _check_stream(op) -> None:
    if op.attr("stream") not in (0, 1):
        fail(op, f"stream = {op.attr('stream')}", "0 (compute stream) or 1 (side stream)")


def _infer(op):
    _check_stream(op)
    t = op.operands[0].type
    if t.dtype not in FLOAT_DTYPES:
        fail(op, f"x has dtype {t.dtype}", FLOAT_DTYPES_TEXT)
    return (t,)


def _run(op, args, ctx):
    """Sum over the ranks of the group, in rank order, in ``ctx.acc``."""
    xs = ctx.group_values(op.operands[0], op.attr("group"), op)
    total = xs[0].astype(ctx.acc)
    for x in xs[1:]:
        total = total + x.astype(ctx.acc)
    return (total,)


# multi-GPU collectives: run on the host between kernels, by fusionc's communicator
COMM = frozenset({"communication"})


def host_collective(op) -> bool:
    """Whether graph op ``op`` is a multi-GPU collective (trait ``communication``): the
    lowerings leave it in the host graph, between the kernels they make."""
    from fusionc.ir.registry import lookup
    d = lookup(op.name)
    return d is not None and d.has("communication")

register(OpDef("all_reduce", __doc__, ("x",),
               (attr("group", POS_INT, doc="number of ranks in the tensor-parallel group"),
                attr("scope", SCOPE, "nvlink", doc="nvlink (one node, peer-to-peer) or nccl"),
                STREAM), _infer, interpret=_run, cost=io_cost,
               traits=COMM))


_ADD_DOC = """all_reduce_add: ``h = all_reduce(x) + residual`` as one collective (the residual add
done while the sum is formed; made by pass ``fuse-allreduce-norm`` from an all_reduce whose sole
use is an add and whose sum is not normalized next). Roundings as the unfused ops: the sum in
fp32 in rank order rounded to the dtype, then the add rounded. ``residual`` must be replicated.
Result: h, the type of x.
"""


def _infer_add(op):
    _check_stream(op)
    x, res = (v.type for v in op.operands)
    same_dtype(op, x, res)
    if x.dtype not in FLOAT_DTYPES or x.rank < 1:
        fail(op, f"x has type {x}", f"[..., D] of {FLOAT_DTYPES_TEXT}")
    if res.shape != x.shape:
        fail(op, f"residual {res} does not match x {x}", f"residual of type {x}")
    return (x,)


def _run_add(op, args, ctx):
    """The sum over the group in rank order, rounded, plus this rank's residual."""
    _replicated(op, ctx.group_values(op.operands[1], op.attr("group"), op))
    (total,) = _run(op, args, ctx)
    if ctx.precise:
        return (total + args[1].astype(ctx.acc),)
    dt = op.operands[0].type.dtype
    return (round_to(round_to(total, dt).astype(ctx.acc) + args[1].astype(ctx.acc), dt),)


register(OpDef("all_reduce_add", _ADD_DOC, ("x", "residual"),
               (attr("group", POS_INT, doc="number of ranks in the tensor-parallel group"),
                attr("scope", SCOPE, "nvlink", doc="nvlink (one node, peer-to-peer) or nccl"),
                STREAM), _infer_add, interpret=_run_add, cost=io_cost,
               traits=COMM))


_FUSED_DOC = """all_reduce_add_rms_norm: ``h = all_reduce(x) + residual``,
``y = rms_norm(h) · weight``, as one collective (TokenWeave: Gond, Kwatra, Ramjee 2025,
arXiv 2505.11329: the all-reduce split into its reduce-scatter and all-gather halves, with the
residual add and the RMSNorm applied between them on each rank's shard of the tokens only).

Algorithm, over the ``group`` ranks of x's group, for x and residual ``[T, D]``: the T rows are
cut into ``group`` contiguous shards of ceil(T / group) rows (the last ones shorter or empty);
rank r (1) reduce-scatters: sums shard r over the ranks in rank order in fp32 and rounds to the
dtype; (2) adds the residual rows of shard r (rounded) and normalizes them (fp32, rounded);
(3) all-gathers: every rank receives every shard of h and y. Shard r uses rank r's residual
and weight, so the residual and the weight must be replicated (equal on every rank), as they
are in tensor parallelism. The roundings are those of the unfused ``all_reduce → add →
rms_norm``, so both forms give the same bits, and every rank receives the same bits.
Results: ``(y, h)``, each ``[T, D]`` in the dtype of x.
"""


def _infer_fused(op):
    _check_stream(op)
    x, res, w = (v.type for v in op.operands)
    same_dtype(op, x, res, w)
    if x.dtype not in FLOAT_DTYPES or x.rank < 1:
        fail(op, f"x has type {x}", f"[..., D] of {FLOAT_DTYPES_TEXT}")
    if res.shape != x.shape:
        fail(op, f"residual {res} does not match x {x}", f"residual of type {x}")
    if w.rank != 1 or w.shape[0] != x.shape[-1]:
        fail(op, f"weight {w} does not match the last axis of x {x}", f"[{x.shape[-1]}]")
    if not 0 <= op.attr("eps") < math.inf:
        fail(op, f"eps = {op.attr('eps')}", "a finite eps >= 0")
    return (x, x)


def _replicated(op, *per_rank) -> None:
    """InputError unless each operand holds the same values on every rank of the group (the
    fused forms are defined for replicated residuals and weights only)."""
    from fusionc.errors import InputError
    for vals, v in zip(per_rank, op.operands[1:]):
        if any(not np.array_equal(a, vals[0], equal_nan=True) for a in vals[1:]):
            raise InputError(f"%{v.name} differs between the ranks of the group", op=op.name,
                             loc=op.loc, valid="a replicated residual and weight, as in tensor "
                             "parallelism (otherwise keep all_reduce and add apart)")


def token_shards(tokens: int, group: int) -> list[slice]:
    """The ``group`` contiguous row shards of ``tokens`` rows: ceil(tokens / group) rows each,
    the last ones shorter or empty."""
    per = -(-tokens // group)
    return [slice(min(r * per, tokens), min((r + 1) * per, tokens)) for r in range(group)]


def _run_fused(op, args, ctx):
    """Reduce-scatter, per-shard add + RMSNorm, all-gather (see the op's documentation)."""
    group, dt = op.attr("group"), op.operands[0].type.dtype
    xs, res, ws = (ctx.group_values(v, group, op) for v in op.operands)
    _replicated(op, res, ws)
    rnd = (lambda a: a) if ctx.precise else (lambda a: round_to(a, dt))  # noqa: E731
    D = xs[0].shape[-1]
    rows = xs[0].reshape(-1, D).shape[0]
    flat = [x.reshape(rows, D) for x in xs]
    h, y = np.empty_like(flat[0], ctx.acc), np.empty_like(flat[0], ctx.acc)
    for r, shard in enumerate(token_shards(rows, group)):  # shard r, computed by rank r
        s = flat[0][shard].astype(ctx.acc)
        for x in flat[1:]:
            s = s + x[shard].astype(ctx.acc)
        h[shard] = rnd(rnd(s) + res[r].reshape(rows, D)[shard].astype(ctx.acc))
        y[shard] = rms_norm_values(h[shard], ws[r], op.attr("eps"), ctx.acc)
    shape = xs[0].shape
    return y.reshape(shape), h.reshape(shape)


register(OpDef("all_reduce_add_rms_norm", _FUSED_DOC, ("x", "residual", "weight"),
               (attr("group", POS_INT, doc="number of ranks in the tensor-parallel group"),
                attr("eps", FLOAT, doc="RMSNorm epsilon"),
                attr("scope", SCOPE, "nvlink", doc="nvlink (one node, peer-to-peer) or nccl"),
                STREAM), _infer_fused, interpret=_run_fused, cost=io_cost,
               traits=COMM))
