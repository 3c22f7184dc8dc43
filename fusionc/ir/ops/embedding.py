"""embedding: rows of a table gathered by token id — the first op of a decoder's step.

``y[b] = table[tokens[b]]`` for ``table [vocab, hidden]`` and ``tokens i32[B]``; ``y [B,
hidden]`` in the table's dtype (a copy: no arithmetic, so no rounding). A token outside
``[0, vocab)`` is an input error when the graph runs (the ids are run-time values).
"""
from __future__ import annotations

import numpy as np

from fusionc.errors import InputError
from fusionc.ir.registry import FLOAT_DTYPES_TEXT, Cost, OpDef, fail, register
from fusionc.ir.types import FLOAT_DTYPES, DType, TensorType


def _infer(op):
    table, tokens = (v.type for v in op.operands)
    if table.rank != 2 or table.dtype not in FLOAT_DTYPES:
        fail(op, f"table {table}", f"[vocab, hidden] of {FLOAT_DTYPES_TEXT}")
    if tokens.rank != 1 or tokens.dtype != DType.i32:
        fail(op, f"tokens {tokens}", "i32[B] token ids")
    return (TensorType(table.dtype, (tokens.shape[0], table.shape[1])),)


def _run(op, args, ctx):
    table, tokens = args
    bad = (tokens < 0) | (tokens >= table.shape[0])
    if bad.any():
        b = int(np.argmax(bad))
        raise InputError(f"tokens[{b}] = {int(tokens[b])}", op=op.name, loc=op.loc,
                         valid=f"0 <= token < {table.shape[0]} (the table's rows)")
    return (np.asarray(table)[tokens.astype(np.int64)],)


def _cost(op, env):
    y = op.result.type if op.results else None
    n = y.nbytes(env) if y is not None else 0
    return Cost(bytes_read=n + op.operands[1].type.nbytes(env), bytes_written=n)


register(OpDef("embedding", __doc__, ("table", "tokens"), (), _infer, interpret=_run,
               cost=_cost))
