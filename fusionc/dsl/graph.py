"""``@fusionc.graph``: trace a Python function into a graph-IR module.

The function runs once, on symbolic tensors (:class:`~fusionc.dsl.tensor.Tracer`); each
``fusionc.*`` op it calls becomes one verified op of the graph. Inputs are declared by
annotation or by decorator keywords::

    @fusionc.graph
    def mlp(x: f16["B", 4096], w: f16[11008, 4096]): ...

    @fusionc.graph(x=fusionc.Tensor("f16", "B", 4096), w=fusionc.Tensor("f16", 11008, 4096))
    def mlp(x, w): ...

Parameters without a tensor type but with a default (``eps=1e-5``) are passed their default.
The decorated name is bound to a :class:`fusionc.ir.Module` holding one graph named after the
function; :func:`module` joins several into one module.
"""
from __future__ import annotations

import inspect
import re
import traceback
from typing import Callable

from fusionc.dsl.builder import Builder
from fusionc.dsl.source import as_dsl_error, code_loc, user_loc
from fusionc.dsl.tensor import Tracer
from fusionc.errors import DSLError, FusionError, Loc
from fusionc.ir.nodes import Graph, Module
from fusionc.ir.types import TensorType
from fusionc.ir.verifier import verify_module

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_HOW = ("annotate it (x: fusionc.f16['B', 4096]) or declare it in the decorator "
        "(@fusionc.graph(x=fusionc.Tensor('f16', 'B', 4096)))")


def graph(fn: Callable | None = None, /, *, name: str | None = None, **inputs: TensorType):
    """Trace ``fn`` into a Module with one graph (usable bare or with arguments).

    Args:
        fn: the function; its tensor parameters become the graph's parameters, in order, named
            as in Python; it returns a tensor or a tuple of tensors (the graph's outputs).
        name: the graph name (default: the function's name).
        **inputs: parameter types, e.g. ``x=fusionc.Tensor("f16", "B", 4096)``; they take
            precedence over annotations.
    Returns:
        ``fusionc.ir.Module`` with one verified graph.
    Raises:
        DSLError: at the offending line of ``fn`` (ill-typed op, missing input type, ...).
    """
    if fn is None:
        return lambda f: graph(f, name=name, **inputs)
    return trace(fn, name=name, inputs=inputs)


def trace(fn: Callable, *, name: str | None = None,
          inputs: dict[str, TensorType] | None = None) -> Module:
    """The function form of :func:`graph`: ``trace(fn, x=...)`` without decorating."""
    loc = code_loc(fn) or user_loc()
    if not callable(fn):
        raise DSLError(f"@fusionc.graph applied to a {type(fn).__name__}", loc=loc,
                       valid="a Python function")
    gname = name or getattr(fn, "__name__", "graph")
    if not _SYMBOL.match(gname):
        raise DSLError(f"bad graph name {gname!r}", loc=loc,
                       valid="letters, digits, '_' and '.', not starting with a digit")
    builder = Builder(gname, loc)
    args, kwargs = _parameters(fn, dict(inputs or {}), builder, loc)
    result = _call(fn, args, kwargs, loc)
    outputs = _outputs(result, builder, gname, loc)
    g = builder.finish(outputs, loc)
    try:
        return verify_module(Module((g,)))
    except FusionError as e:  # defensive: every op was verified when it was traced
        raise as_dsl_error(e, loc) from None


def _call(fn, args, kwargs, loc):
    """Run the traced function; a Python error inside it (e.g. ``x.numpy()`` on a traced
    tensor) becomes a DSLError at the innermost line of the user's file, the original chained."""
    try:
        return fn(*args, **kwargs)
    except FusionError:
        raise
    except RecursionError:
        raise DSLError("the traced function recursed too deeply", loc=loc,
                       valid="a function that builds a finite graph") from None
    except Exception as e:  # noqa: BLE001 - any user error while tracing, reported at its line
        where = loc
        code = getattr(fn, "__code__", None)
        for frame, line in traceback.walk_tb(e.__traceback__):
            if code is not None and frame.f_code.co_filename == code.co_filename:
                where = Loc(code.co_filename, line, 1)
        raise DSLError(f"{type(e).__name__} while tracing: {e}", loc=where,
                       valid="fusionc DSL operations on traced tensors (fusionc.linear, "
                             "fusionc.rms_norm, +, *, ...); traced tensors have no values") from e


def _parameters(fn, inputs, builder, loc):
    args, kwargs = [], {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise DSLError(f"*{p.name} parameters cannot be traced", loc=loc,
                           valid="one named parameter per graph input")
        spec = inputs.pop(p.name) if p.name in inputs else _annotation(fn, p, loc)
        if isinstance(spec, TensorType):
            value = builder.param(p.name, spec, loc)
        elif p.default is not p.empty:
            value = p.default
        else:
            raise DSLError(f"parameter '{p.name}' has no tensor type", loc=loc, valid=_HOW)
        if p.kind == p.KEYWORD_ONLY:
            kwargs[p.name] = value
        else:
            args.append(value)
    if inputs:
        raise DSLError(f"types given for unknown parameters {sorted(inputs)}", loc=loc,
                       valid="parameter names of the function")
    return args, kwargs


def _annotation(fn, p, loc):
    ann = p.annotation
    if isinstance(ann, str):  # `from __future__ import annotations`
        scope = dict(inspect.getclosurevars(fn).nonlocals)
        try:
            ann = eval(ann, fn.__globals__, scope)  # noqa: S307 - the user's own annotation
        except Exception as e:
            raise DSLError(f"cannot evaluate the annotation of '{p.name}': {p.annotation!r} "
                           f"({type(e).__name__}: {e})", loc=loc,
                           valid="with `from __future__ import annotations`, sizes from an "
                                 "enclosing function are not visible; declare the input in "
                                 "the decorator instead") from None
    if ann is not p.empty and not isinstance(ann, TensorType) and p.default is p.empty:
        raise DSLError(f"parameter '{p.name}' is annotated {ann!r}, not a tensor type",
                       loc=loc, valid=_HOW)
    return ann


def _outputs(result, builder, gname, loc) -> tuple[Tracer, ...]:
    outs = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    if not outs:
        raise DSLError(f"graph @{gname} returns nothing", loc=loc,
                       valid="return a tensor or a tuple of tensors")
    for t in outs:
        if not isinstance(t, Tracer):
            raise DSLError(f"graph @{gname} returns a {type(t).__name__}", loc=loc,
                           valid="return a tensor or a tuple of tensors")
        if t.builder is not builder:
            raise DSLError(f"graph @{gname} returns %{t.name} of graph @{t.builder.name}",
                           loc=loc, valid="tensors computed by this graph")
    return outs


def module(*items: Module | Graph) -> Module:
    """One module of the graphs of ``items`` (modules or graphs), in order.

    E.g. ``module(attention, mlp)`` for two ``@fusionc.graph`` functions. Raises DSLError if
    two graphs share a name.
    """
    graphs: list[Graph] = []
    for it in items:
        if isinstance(it, Module):
            graphs.extend(it.graphs)
        elif isinstance(it, Graph):
            graphs.append(it)
        else:
            raise DSLError(f"module() got a {type(it).__name__}", loc=user_loc(),
                           valid="@fusionc.graph functions (modules) or graphs")
    try:
        return verify_module(Module(tuple(graphs)))
    except FusionError as e:
        raise as_dsl_error(e, user_loc()) from None
