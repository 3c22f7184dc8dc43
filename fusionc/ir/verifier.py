"""The verifier: checks that a module is well formed. Runs between passes.

Rules checked for every graph and kernel:
- names: value and item names are valid identifiers; every item name is unique;
- SSA: every value is defined once per graph (parameters included) and used only after its
  definition, inside the region that defines it or a nested one; returned values are defined;
- ops: the op exists, may appear in this kind of item, has the right number of operands and
  regions, its attributes follow the registry schema (no unknown, none missing, right kinds);
- types: dims are positive ints or symbol names; each result type equals the type the op's
  inference rule derives (which checks shapes, dtypes, head counts);
- item kinds may add checks (kernels: launch shape, shared memory, collectives).
Errors are :class:`fusionc.errors.VerifyError` at the op's location (IR line:column or DSL line).
"""
from __future__ import annotations

import difflib
import math
import re

from fusionc.errors import VerifyError
from fusionc.ir.nodes import Graph, Module, Op, Value
from fusionc.ir.registry import FUNC_KINDS, all_ops, func_kind, lookup
from fusionc.ir.types import TensorType

_NAME = re.compile(r"[A-Za-z0-9_.]+\Z")
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")


def verify_module(m: Module) -> Module:
    """Check every graph and kernel of ``m``; returns ``m`` (for chaining)."""
    seen = set()
    for g in m.graphs:
        if g.name in seen:
            raise VerifyError(f"@{g.name} is defined twice", loc=g.loc,
                              valid="unique graph and kernel names")
        seen.add(g.name)
    for g in m.graphs:
        verify_graph(g, m)
    return m


def verify_graph(g: Graph, module: Module | None = None) -> None:
    """Check one graph or kernel (see the module docstring)."""
    kind = func_kind(g.kind)
    if kind is None:
        raise VerifyError(f"unknown item kind '{g.kind}'", loc=g.loc, valid=", ".join(FUNC_KINDS))
    if not _SYMBOL.match(g.name):
        raise VerifyError(f"bad name @{g.name}", loc=g.loc, valid="letters, digits, _ and .")
    canon = kind.make_attrs(dict(g.attrs), g.loc)
    if _exact(canon) != _exact(g.attrs):
        raise VerifyError("attributes not in canonical form (order, defaults, value types)",
                          op=g.kind, loc=g.loc, valid=_fmt_attrs(kind.attrs, canon))
    defined: set[str] = set()
    scope: dict[str, Value] = {}
    for p in g.params:
        _define(p, defined, scope, g, None)
    _verify_ops(g.body, g, module, defined, scope)
    for v in g.outputs:
        _check_use(v, scope, g, None, "returned")
    if kind.verify is not None:
        kind.verify(g, module)


def _verify_ops(ops, g, module, defined, scope) -> None:
    for op in ops:
        for v in op.operands:  # SSA first: inference below trusts the operand types
            _check_use(v, scope, g, op, "used")
        verify_op(op, g.kind)
        d = lookup(op.name)
        if d.verify is not None:
            d.verify(op, g, module)
        for region in op.regions:
            _verify_ops(region, g, module, defined, dict(scope))
        for r in op.results:
            _define(r, defined, scope, g, op)


def verify_op(op: Op, where: str = "graph") -> None:
    """Check one op on its own: registry entry, operands, attributes, regions, result types."""
    d = lookup(op.name)
    if d is None:
        close = difflib.get_close_matches(op.name, all_ops(), n=3)
        raise VerifyError(f"unknown op '{op.name}'", op=op.name, loc=op.loc,
                          valid="did you mean " + ", ".join(close) if close else None)
    if where not in d.where:
        raise VerifyError(f"op not allowed in a {where}", op=op.name, loc=op.loc,
                          valid="inside " + " or ".join(sorted(d.where)))
    n = len(op.operands)
    if not d.min_operands <= n <= d.max_operands:
        lo, hi = d.min_operands, d.max_operands
        want = str(lo) if lo == hi else f"{lo} or more" if hi == math.inf else f"{lo} to {hi}"
        raise VerifyError(f"{n} operand{'' if n == 1 else 's'} given, {want} expected",
                          op=op.name, loc=op.loc, valid=d.signature())
    if len(op.regions) != d.regions:
        raise VerifyError(f"{len(op.regions)} regions given, {d.regions} expected",
                          op=op.name, loc=op.loc)
    canon = d.make_attrs(dict(op.attrs), op.loc)
    if _exact(canon) != _exact(op.attrs):
        raise VerifyError("attributes not in canonical form (order, defaults, value types)",
                          op=op.name, loc=op.loc, valid=_fmt_attrs(d.attrs, canon))
    for v in op.operands:
        _check_type(v.type, op)
    try:
        inferred = d.infer(op)
    except (IndexError, TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError):
        # an inference rule that did not foresee these operands: still the user's IR at fault
        raise VerifyError("operand types (" + ", ".join(str(v.type) for v in op.operands) +
                          ") do not fit the op", op=op.name, loc=op.loc,
                          valid=d.signature()) from None
    got = tuple(r.type for r in op.results)
    if got != tuple(inferred):
        raise VerifyError(
            "result types " + _types(got) + " do not match the inferred " + _types(inferred),
            op=op.name, loc=op.loc, valid=_types(inferred))


def _exact(v):
    """``v`` with the type of every value, so that 1 != 1.0 (an int given for a float attribute
    prints differently) and -0.0 != 0.0."""
    if isinstance(v, tuple):
        return tuple(_exact(x) for x in v)
    return (type(v), repr(v) if isinstance(v, float) else v)


def _fmt_attrs(specs, attrs) -> str:
    kinds = {a.name: a.kind for a in specs}
    return "{" + ", ".join(f"{k} = {kinds[k].format(v)}" for k, v in attrs) + "}"


def _types(ts) -> str:
    return "(" + ", ".join(str(t) for t in ts) + ")"


def _check_type(t: TensorType, op: Op | None, g: Graph | None = None,
                name: str | None = None) -> None:
    for d in t.shape:
        ok = (isinstance(d, int) and not isinstance(d, bool) and d >= 1) or (
            isinstance(d, str) and _SYMBOL.match(d))
        if not ok:
            of = f" of %{name}" if name else ""
            raise VerifyError(f"bad dimension {d!r} in {t}{of}", op=op.name if op else None,
                              loc=op.loc if op else g.loc if g else None,
                              valid="positive integers or symbol names such as B")


def _define(v: Value, defined: set, scope: dict, g: Graph, op: Op | None) -> None:
    loc = op.loc if op else g.loc
    if not _NAME.match(v.name):
        raise VerifyError(f"bad value name %{v.name}", op=op.name if op else None, loc=loc,
                          valid="letters, digits, _ and .")
    if v.name in defined:
        raise VerifyError(f"value %{v.name} is defined twice", op=op.name if op else None,
                          loc=loc, valid="a fresh name (SSA: one definition per value)")
    _check_type(v.type, op, g, v.name)
    defined.add(v.name)
    scope[v.name] = v


def _check_use(v: Value, scope: dict, g: Graph, op: Op | None, how: str) -> None:
    loc = op.loc if op else g.loc
    if v.name not in scope:
        raise VerifyError(f"use of undefined value %{v.name}", op=op.name if op else None,
                          loc=loc, valid="a value defined earlier in this graph or a parameter")
    if scope[v.name].type != v.type:
        raise VerifyError(f"%{v.name} {how} as {v.type} but defined as {scope[v.name].type}",
                          op=op.name if op else None, loc=loc)
