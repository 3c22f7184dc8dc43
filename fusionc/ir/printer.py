"""Print modules, graphs and ops in the generic text form (see ``grammar.lark``).

``parse_module(print_module(m)) == m`` for every valid module.
"""
from __future__ import annotations

from fusionc.ir.nodes import Graph, Module, Op, Value
from fusionc.ir.registry import AttrKind, func_kind, lookup

_GENERIC = AttrKind("int")  # formats ints, floats, bools, symbols and lists


def print_module(m: Module) -> str:
    """The text of every graph and kernel of ``m``, separated by blank lines."""
    return "\n\n".join(print_graph(g) for g in m.graphs) + "\n"


def print_graph(g: Graph) -> str:
    """``graph @name(params) { ops; return values }`` (or ``kernel @name {attrs} ...``)."""
    kind = func_kind(g.kind)
    specs = {a.name: a.kind for a in kind.attrs} if kind else {}
    head = f"{g.kind} @{g.name}"
    if g.attrs:
        head += " " + _attrs(g.attrs, specs) + " "
    params = ", ".join(f"%{p.name}: {p.type}" for p in g.params)
    lines = [f"{head}({params}) {{"]
    for op in g.body:
        lines.extend(_op_lines(op, "  "))
    outs = ", ".join(str(v) for v in g.outputs)
    lines.append(f"  return {outs}".rstrip())
    lines.append("}")
    return "\n".join(lines)


def print_op(op: Op) -> str:
    """One op (and its regions) as text."""
    return "\n".join(_op_lines(op, ""))


def _op_lines(op: Op, indent: str) -> list[str]:
    d = lookup(op.name)
    specs = {a.name: a.kind for a in d.attrs} if d else {}
    hidden = {a.name: a.default for a in d.attrs if a.default == () or a.omit} if d else {}
    attrs = tuple((k, v) for k, v in op.attrs if not (k in hidden and v == hidden[k]))
    text = ""
    if op.results:
        text = ", ".join(str(r) for r in op.results) + " = "
    text += f"{op.name}({', '.join(str(v) for v in op.operands)})"
    if attrs:  # attributes at an empty-list or omitted default are left out (they parse back)
        text += " " + _attrs(attrs, specs)
    if op.results:
        text += " : " + ", ".join(str(r.type) for r in op.results)
    if not op.regions:
        return [indent + text]
    lines = [indent + text + " ({"]
    for i, region in enumerate(op.regions):
        if i:
            lines.append(indent + "}, {")
        for inner in region:
            lines.extend(_op_lines(inner, indent + "  "))
    lines.append(indent + "})")
    return lines


def _attrs(attrs, specs) -> str:
    return "{" + ", ".join(f"{k} = {specs.get(k, _GENERIC).format(v)}" for k, v in attrs) + "}"


def value_decl(v: Value) -> str:
    """``%name: type``."""
    return f"%{v.name}: {v.type}"
