"""Pass ``fuse-allreduce-norm``: ``all_reduce → add(residual) → rms_norm`` becomes one
``all_reduce_add_rms_norm`` (TokenWeave's reordering: reduce-scatter, then the residual add and
the RMSNorm on each rank's token shard only, then all-gather; ``fusionc.ir.ops.comm``).

Matched: ``%s = all_reduce(%x) {group, scope}``; ``%h = add(%s, %r)`` (either operand order)
whose operands have the same type; ``%y = rms_norm(%h, %w) {eps}`` over the last axis. ``%s``
must have no other use (its value disappears); ``%h`` may (it is the fused op's second result).
When no such rms_norm follows (or its weight is computed after the add), ``all_reduce → add``
alone becomes ``all_reduce_add`` (the residual add fused into the collective); an all_reduce
whose sum has another use stays as it is.
"""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.ir.nodes import Graph, Module, Op, Value, users as value_users
from fusionc.ir.registry import lookup
from fusionc.passes.base import Pass, register_pass


@register_pass
@dataclass(frozen=True)
class FuseAllReduceNorm(Pass):
    """See the module docstring."""

    name = "fuse-allreduce-norm"

    def run(self, module: Module) -> Module:
        return Module(tuple(self.rewrite(g) if g.kind == "graph" else g for g in module.graphs))

    def rewrite(self, g: Graph) -> Graph:
        """``g`` with every matched all_reduce → add → rms_norm chain fused."""
        users = value_users(g)
        body, dropped, taken = list(g.body), set(), set()
        for ar in g.body:
            m = _match(ar, users, g.outputs)
            if m is None or id(m[0]) in taken:
                continue   # e.g. all_reduce(a) + all_reduce(b): the add is fused once
            add, norm, residual = m
            taken.add(id(add))
            at = body.index(add)
            comm = {"group": ar.attr("group"), "scope": ar.attr("scope"),
                    "stream": ar.attr("stream")}
            if norm is None or not _defined_before(norm.operands[1], g, body[:at]):
                body[at] = Op("all_reduce_add", (add.result,), (ar.operands[0], residual),
                              lookup("all_reduce_add").make_attrs(comm), loc=ar.loc)
                dropped.add(id(ar))
                continue
            body[at] = Op("all_reduce_add_rms_norm", (norm.result, add.result),
                          (ar.operands[0], residual, norm.operands[1]),
                          lookup("all_reduce_add_rms_norm").make_attrs(
                              {**comm, "eps": norm.attr("eps")}), loc=ar.loc)
            dropped.update({id(ar), id(norm)})
        return g.replace(body=tuple(op for op in body if id(op) not in dropped))


def _defined_before(v: Value, g: Graph, ops: list[Op]) -> bool:
    return any(p.name == v.name for p in g.params) or \
        any(r.name == v.name for op in ops for r in op.results)


def _match(ar: Op, users: dict, outputs: tuple[Value, ...]):
    """(add, rms_norm or None, residual) following all_reduce ``ar``, or None."""
    if ar.name != "all_reduce":
        return None
    s = ar.result
    uses = users.get(s.name, [])
    if len(uses) != 1 or uses[0].name != "add" or any(o.name == s.name for o in outputs):
        return None
    add = uses[0]
    a, b = add.operands
    residual = b if a.name == s.name else a
    if residual.name == s.name or residual.type != s.type:
        return None
    norms = [u for u in users.get(add.result.name, []) if u.name == "rms_norm"
             and u.operands[0].name == add.result.name]
    return add, (norms[0] if len(norms) == 1 else None), residual
