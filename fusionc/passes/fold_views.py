"""Pass ``fold-views``: views (``reshape``, and ``split_heads`` / ``merge_heads``, which the DSL
writes as reshapes) move past elementwise ops and cancel, so that graphs of norm / linear /
elementwise ops that view their rows as heads for a while lower like their flat form.

A view is row-major metadata: no data moves, so an elementwise op (trait ``elementwise``: add,
mul, silu, silu_mul, cast) commutes with it. Rewrites, to a fixed point:

- ``reshape(reshape(x))`` → ``reshape(x)``;
- ``reshape(x)`` of x's own type → x; for a graph output (whose name the caller binds), x's
  producer takes the output's name when nothing else reads x;
- ``e(reshape(a), reshape(b), ...)`` with a, b, ... of one shape → ``reshape(e(a, b, ...))``
  (the op's new result is named ``<result>.flat``);
- a reshape nothing reads (and no output) is dropped.

Views left after it (a graph input or output in heads form, a view before a norm or a linear
that does not cancel) stay, and ``partition-units`` / the library path name them.
"""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.ir.nodes import Graph, Module, Op, Value, users
from fusionc.ir.registry import lookup
from fusionc.ir.types import TensorType
from fusionc.passes.base import Pass, register_pass


@register_pass
@dataclass(frozen=True)
class FoldViews(Pass):
    """See the module docstring."""

    name = "fold-views"

    def run(self, module: Module) -> Module:
        return Module(tuple(fold_views(g) if g.kind == "graph" else g for g in module.graphs))


def fold_views(g: Graph) -> Graph:
    """``g`` with its views moved past elementwise ops and cancelled (the module docstring)."""
    while True:
        g = _dead_views(g)   # first: a dead view must not count as a use
        new = _step(g)
        if new is g:
            return g
        g = new


def _step(g: Graph) -> Graph:
    """``g`` after the first rewrite that applies, or ``g`` itself."""
    prod = {r.name: op for op in g.body for r in op.results}
    outs = {v.name for v in g.outputs}
    for i, op in enumerate(g.body):
        if op.name == "reshape":
            src = prod.get(op.operands[0].name)
            if src is not None and src.name == "reshape":
                return _put(g, i, [op.replace(operands=src.operands)])
            if op.operands[0].type == op.result.type:
                if op.result.name not in outs:
                    return _substitute(g, i, op.result, op.operands[0])
                if _renamable(g, op, src, outs):
                    return _rename(g, i, src, op.result)
        elif lookup(op.name).has("elementwise") and op.operands:
            srcs = [prod.get(v.name) for v in op.operands]
            if all(s is not None and s.name == "reshape" for s in srcs):
                flat = [s.operands[0] for s in srcs]
                if len({v.type.shape for v in flat}) == 1:
                    return _put(g, i, _sink(g, op, flat))
    return g


def _sink(g: Graph, op: Op, flat: list[Value]) -> list[Op]:
    """``[e(flat...), reshape]`` for elementwise ``op`` whose operands are views of ``flat``."""
    r = op.result
    taken = {v.name for v in g.params} | {x.name for o in g.body for x in o.results}
    name = r.name + ".flat"
    while name in taken:
        name += "_"
    probe = op.replace(operands=tuple(flat))
    ty, = lookup(op.name).infer(probe)
    inner = probe.replace(results=(Value(name, TensorType(ty.dtype, ty.shape)),))
    view = Op("reshape", (r,), (inner.result,),
              lookup("reshape").make_attrs({"shape": tuple(r.type.shape)}, op.loc), (), op.loc)
    return [inner, view]


def _renamable(g: Graph, view: Op, src: Op | None, outs: set[str]) -> bool:
    """Whether the producer of an identity view that is a graph output may take the output's
    name: an op of the body whose result only the view reads and that is no output itself."""
    v = view.operands[0]
    return src is not None and len(src.results) == 1 and v.name not in outs and \
        users(g).get(v.name, []) == [view]


def _rename(g: Graph, i: int, src: Op, out: Value) -> Graph:
    """``g`` without view ``i``; its producer ``src`` returns the view's result ``out``."""
    body = [src.replace(results=(out,)) if o is src else o
            for j, o in enumerate(g.body) if j != i]
    return g.replace(body=tuple(body))


def _put(g: Graph, i: int, ops: list[Op]) -> Graph:
    return g.replace(body=g.body[:i] + tuple(ops) + g.body[i + 1:])


def _substitute(g: Graph, i: int, old: Value, new: Value) -> Graph:
    """``g`` without op ``i``, its result ``old`` read as ``new`` everywhere."""
    def sub(op: Op) -> Op:
        ins = tuple(new if v.name == old.name else v for v in op.operands)
        return op if ins == op.operands else op.replace(operands=ins)
    return g.replace(body=tuple(sub(op) for j, op in enumerate(g.body) if j != i))


def _dead_views(g: Graph) -> Graph:
    while True:
        use, outs = users(g), {v.name for v in g.outputs}
        body = tuple(op for op in g.body if not (
            op.name == "reshape" and op.result.name not in use and op.result.name not in outs))
        if len(body) == len(g.body):
            return g
        g = g.replace(body=body)


__all__ = ["FoldViews", "fold_views"]
