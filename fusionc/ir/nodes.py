"""IR nodes: immutable SSA values, ops, graphs and modules.

One set of node classes serves both IR levels. A *graph* (``kind="graph"``) holds graph-IR ops
(rms_norm, linear, decode_attention, ...) or, after lowering, launches of kernels; a *kernel*
(``kind="kernel"``) holds tile-IR ops executed by every CTA of a grid of clusters. Which ops may
appear where is part of each op's registry entry (``fusionc.ir.registry``).

All nodes are frozen, slotted dataclasses with children in tuples, so they hash, compare by value
and can be shared between modules. Source locations are carried but do not take part in equality:
``parse(print(m)) == m`` compares structure, names, types and attributes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from fusionc.errors import Loc
from fusionc.ir.types import TensorType


@dataclass(frozen=True, slots=True)
class SymbolRef:
    """A reference to a graph or kernel of the module by name: ``@attn_k0`` in text."""

    name: str

    def __str__(self) -> str:
        return f"@{self.name}"


AttrValue = int | float | bool | str | SymbolRef | tuple  # tuples nest these
Attrs = tuple[tuple[str, AttrValue], ...]


@dataclass(frozen=True, slots=True)
class Value:
    """An SSA value: a name (printed ``%name``) and its tensor type."""

    name: str
    type: TensorType

    def __str__(self) -> str:
        return f"%{self.name}"


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: ``%r = name(%a, %b) {attr = v} : type ({ region })``.

    Attributes are stored in the order the op's registry entry declares them, with defaults
    filled in, so two ops that mean the same compare equal. ``regions`` hold nested op lists
    (the body of a per-CTA branch, say); values defined outside are visible inside.
    """

    name: str
    results: tuple[Value, ...]
    operands: tuple[Value, ...]
    attrs: Attrs = ()
    regions: tuple[tuple["Op", ...], ...] = ()
    loc: Loc | None = field(default=None, compare=False)

    def attr(self, key: str) -> AttrValue:
        """The value of attribute ``key`` (KeyError if the op has none of that name)."""
        for k, v in self.attrs:
            if k == key:
                return v
        raise KeyError(f"op '{self.name}' has no attribute '{key}'")

    @property
    def attr_dict(self) -> dict[str, AttrValue]:
        return dict(self.attrs)

    @property
    def result(self) -> Value:
        """The single result (ValueError if the op has not exactly one)."""
        if len(self.results) != 1:
            raise ValueError(f"op '{self.name}' has {len(self.results)} results")
        return self.results[0]

    def replace(self, **changes: Any) -> "Op":
        return replace(self, **changes)

    def walk(self) -> Iterator["Op"]:
        """This op, then every op nested in its regions, in program order."""
        yield self
        for region in self.regions:
            for op in region:
                yield from op.walk()


@dataclass(frozen=True, slots=True)
class Graph:
    """A named function of the module: parameters, a body of ops, and returned values.

    ``kind`` is ``"graph"`` for graph IR (and host-side launch sequences after lowering) or
    ``"kernel"`` for a tile-IR cluster kernel, whose launch shape lives in ``attrs``
    (``grid``, ``cluster``, ``threads``, ...; see ``fusionc.ir.registry.FUNC_KINDS``).
    """

    name: str
    params: tuple[Value, ...]
    body: tuple[Op, ...]
    outputs: tuple[Value, ...]
    kind: str = "graph"
    attrs: Attrs = ()
    loc: Loc | None = field(default=None, compare=False)

    def attr(self, key: str) -> AttrValue:
        for k, v in self.attrs:
            if k == key:
                return v
        raise KeyError(f"{self.kind} '{self.name}' has no attribute '{key}'")

    def walk(self) -> Iterator[Op]:
        """Every op of the body, nested ones included, in program order."""
        for op in self.body:
            yield from op.walk()

    def replace(self, **changes: Any) -> "Graph":
        return replace(self, **changes)

    def _repr_html_(self) -> str:
        from fusionc.display import graph_html
        return graph_html(self)

    def _repr_pretty_(self, p, cycle) -> None:
        from fusionc.display import graph_text
        p.text("..." if cycle else graph_text(self))


@dataclass(frozen=True, slots=True)
class Module:
    """A set of named graphs and kernels, in order."""

    graphs: tuple[Graph, ...]

    def __getitem__(self, name: str) -> Graph:
        for g in self.graphs:
            if g.name == name:
                return g
        raise KeyError(f"module has no graph or kernel named '@{name}'")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.graphs)

    def replace(self, **changes: Any) -> "Module":
        return replace(self, **changes)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module's graph in the graph-IR interpreter (``fusionc.interpret``), called
        like the traced function: numpy arrays positionally (in parameter order) or by
        parameter name. Returns the output array, or a tuple of them when the graph has several
        outputs. A module of several graphs: call ``fusionc.interpret(module, inputs,
        graph=NAME)``. Raises InputError for missing, unknown or ill-shaped inputs.
        """
        from fusionc.errors import InputError
        from fusionc.interp.interpreter import interpret
        graphs = [g for g in self.graphs if g.kind == "graph"]
        if len(graphs) != 1:
            raise InputError(f"a module of {len(graphs)} graphs is called",
                             valid="a module of one graph, or fusionc.interpret(module, "
                                   "inputs, graph=one of " + ", ".join(self.names) + ")")
        g = graphs[0]
        if len(args) > len(g.params):
            raise InputError(f"graph @{g.name} takes {len(g.params)} inputs, {len(args)} given",
                             loc=g.loc, valid=", ".join(p.name for p in g.params))
        inputs = dict(zip((p.name for p in g.params), args))
        twice = sorted(set(inputs) & set(kwargs))
        if twice:
            raise InputError(f"graph @{g.name}: inputs {twice} given positionally and by name",
                             loc=g.loc, valid="each input once")
        outs = interpret(g, {**inputs, **kwargs})
        return outs[0] if len(outs) == 1 else outs

    def _repr_html_(self) -> str:
        from fusionc.display import module_html
        return module_html(self)

    def _repr_pretty_(self, p, cycle) -> None:
        from fusionc.display import module_text
        p.text("..." if cycle else module_text(self))


def users(g: "Graph") -> dict[str, list["Op"]]:
    """Value name -> the top-level ops of graph ``g`` that read it, in program order."""
    out: dict[str, list[Op]] = {}
    for op in g.body:
        for v in op.operands:
            out.setdefault(v.name, []).append(op)
    return out
