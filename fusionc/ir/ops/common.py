"""Shared helpers for op definitions: cost of reading operands and writing results."""
from __future__ import annotations

from fusionc.ir.nodes import Op
from fusionc.ir.registry import Cost


def io_cost(op: Op, env: dict[str, int], flops: int = 0) -> Cost:
    """Every operand read once and every result written once, plus ``flops``.

    Symbolic dims are taken from ``env`` (e.g. ``{"B": 1}``).
    """
    return Cost(bytes_read=sum(v.type.nbytes(env) for v in op.operands),
                bytes_written=sum(v.type.nbytes(env) for v in op.results), flops=flops)


def numel(op: Op, env: dict[str, int]) -> int:
    """Elements of the first result."""
    return op.results[0].type.numel(env)
