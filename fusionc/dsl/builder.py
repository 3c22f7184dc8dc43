"""The graph builder behind tracing: fresh SSA names, one verified op per DSL call.

Each DSL op function calls :func:`emit`, which finds the builder of its operands, asks the op's
registry entry for its result types (inference is verification) and appends the op with the
user's ``file:line`` as its location. Any error becomes a :class:`fusionc.errors.DSLError` at
that line.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from fusionc.dsl.source import as_dsl_error, user_loc
from fusionc.dsl.tensor import Tracer
from fusionc.errors import DSLError, FusionError, Loc
from fusionc.ir.fp32 import check_fp32_op
from fusionc.ir.nodes import Graph, Op, Value
from fusionc.ir.registry import lookup
from fusionc.ir.types import TensorType
from fusionc.ir.verifier import verify_op

__all__ = ["Builder", "emit", "user_loc"]

_NAME = re.compile(r"[A-Za-z0-9_.]+\Z")


class Builder:
    """Collects the parameters and ops of one graph while its function is traced."""

    def __init__(self, name: str, loc: Loc | None):
        self.name, self.loc = name, loc
        self.params: list[Value] = []
        self.ops: list[Op] = []
        self.closed = False
        self._used: set[str] = set()
        self._counter = 0

    def fresh(self, hint: str | None, loc: Loc | None) -> str:
        """A unique value name: ``hint`` (``hint.1``, ``hint.2`` if taken) or ``0, 1, ...``."""
        if hint is None:
            while str(self._counter) in self._used:
                self._counter += 1
            name = str(self._counter)
        else:
            if not isinstance(hint, str) or not _NAME.match(hint):
                raise DSLError(f"bad value name {hint!r}", loc=loc,
                               valid="a non-empty name of letters, digits, '_' and '.'")
            name, k = hint, 1
            while name in self._used:
                name, k = f"{hint}.{k}", k + 1
        self._used.add(name)
        return name

    def param(self, name: str, type: TensorType, loc: Loc | None) -> Tracer:
        """A graph input called ``name`` (unique-ified) of ``type``."""
        v = Value(self.fresh(name, loc), type)
        self.params.append(v)
        return Tracer(v, self)

    def emit(self, opname: str, operands: Sequence[Value], attrs: dict[str, Any],
             names, loc: Loc | None) -> tuple[Tracer, ...]:
        """Append op ``opname`` and return tracers of its results (see :func:`emit`)."""
        d = lookup(opname)
        try:
            canon = d.make_attrs({k: _plain(v) for k, v in attrs.items()}, loc)
            op = Op(opname, (), tuple(operands), canon, (), loc)
            check_fp32_op(op)
            types = tuple(d.infer(op))
            op = op.replace(results=self._results(types, names, loc))
            verify_op(op, "graph")
        except DSLError:
            raise
        except FusionError as e:
            raise as_dsl_error(e, loc) from None
        self.ops.append(op)
        return tuple(Tracer(v, self) for v in op.results)

    def _results(self, types, names, loc) -> tuple[Value, ...]:
        if names is None or isinstance(names, str):
            hints = [names if names is None or len(types) == 1 else f"{names}.{i}"
                     for i in range(len(types))]
        else:
            hints = list(names)
            if len(hints) != len(types):
                raise DSLError(f"{len(hints)} names given for {len(types)} results", loc=loc,
                               valid=f"a name or {len(types)} names")
        return tuple(Value(self.fresh(h, loc), t) for h, t in zip(hints, types))

    def finish(self, outputs: Sequence[Tracer], loc: Loc | None) -> Graph:
        """The traced graph returning ``outputs``; closes the builder."""
        self.closed = True
        return Graph(self.name, tuple(self.params), tuple(self.ops),
                     tuple(t.value for t in outputs), "graph", (), loc)


def _plain(v: Any) -> Any:
    """numpy scalars as Python ints/floats, lists as tuples (attribute values)."""
    if isinstance(v, (list, tuple)):
        return tuple(_plain(x) for x in v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


def emit(opname: str, operands: Sequence, attrs: dict[str, Any] | None = None,
         name=None) -> tuple[Tracer, ...]:
    """Record op ``opname`` on the graph being traced; return its results as tracers.

    Args:
        opname: a registered graph-IR op.
        operands: tracers, in the order of the op's registry signature.
        attrs: attribute values (checked and put in canonical order by the registry).
        name: a name for the result (``name.0, name.1, ...`` for several), or one name per
            result; None gives ``%0, %1, ...``.
    Raises:
        DSLError: at the user's line — an operand that is not a traced tensor, tensors of two
            graphs, or anything the op's type inference rejects.
    """
    loc = user_loc()
    builder = _builder_of(opname, operands, loc)
    return builder.emit(opname, [t.value for t in operands], attrs or {}, name, loc)


def _builder_of(opname: str, operands: Sequence, loc: Loc | None) -> Builder:
    slots = [s.rstrip("?*") for s in lookup(opname).operands]
    builder = None
    for i, t in enumerate(operands):
        what = slots[min(i, len(slots) - 1)]
        if not isinstance(t, Tracer):
            raise DSLError(f"operand '{what}' is a {type(t).__name__}, not a tensor",
                           op=opname, loc=loc,
                           valid="a traced tensor (a graph input or an op result); there are "
                                 "no Python scalar operands")
        if builder is None:
            builder = t.builder
        elif t.builder is not builder:
            raise DSLError(f"operand '{what}' %{t.name} belongs to graph @{t.builder.name}, "
                           f"not @{builder.name}", op=opname, loc=loc,
                           valid="tensors of the graph being traced")
    if builder.closed:
        raise DSLError(f"graph @{builder.name} has finished tracing", op=opname, loc=loc,
                       valid="ops inside the @fusionc.graph function")
    return builder
