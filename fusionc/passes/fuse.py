"""Pass ``fuse``: merge the kernels of consecutive launches into as few kernels as correctness
allows.

``partition-cluster`` already lowers each decoder stage to one kernel: the attention block
(RMSNorm → QKV → QK-norm → RoPE → KV append → attention → O projection → residual) and the MLP
block (RMSNorm → gate/up → SiLU·mul → down → residual) are one kernel each, because their only
cross-cluster dependency (the sums over heads or over the intermediate dimension) goes through the
deterministic off-chip ``grid_reduce`` at the very end. This pass merges further:

two consecutive launches A; B become one kernel when B reads nothing A writes (no value flows
between them) and both use the same cluster size and CTA size; the smaller grid's program is
guarded by ``when(cluster < grid)``. A boundary remains where B consumes an output of A: CTAs of
one launch have no grid-wide ordering, and A's outputs are complete only after its whole grid
(its ``grid_reduce``) has finished — e.g. between the attention and MLP blocks of a layer, whose
RMSNorm needs the whole new hidden state. Programmatic dependent launch hides such boundaries
(issue 8) instead of removing them.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusionc.ir.nodes import Graph, Module, Op, SymbolRef, Value
from fusionc.ir.registry import func_kind, lookup
from fusionc.passes.base import Pass, register_pass


@register_pass
@dataclass(frozen=True)
class Fuse(Pass):
    """See the module docstring."""

    name = "fuse"

    def run(self, module: Module) -> Module:
        kernels = {g.name: g for g in module.graphs if g.kind == "kernel"}
        hosts = []
        for g in module.graphs:
            if g.kind == "graph":
                hosts.append(self.fuse_graph(g, kernels))
        used = {op.attr("kernel").name for h in hosts for op in h.body if op.name == "launch"}
        return Module(tuple(kernels[n] for n in kernels if n in used) + tuple(hosts))

    def fuse_graph(self, g: Graph, kernels: dict[str, Graph]) -> Graph:
        """``g`` with consecutive mergeable launches merged (the merged kernels join ``kernels``).
        """
        body: list[Op] = []
        for op in g.body:
            prev = body[-1] if body else None
            if (
                op.name == "launch"
                and prev is not None
                and prev.name == "launch"
                and mergeable(
                    kernels[prev.attr("kernel").name], kernels[op.attr("kernel").name], prev, op
                )
            ):
                body[-1] = merge(kernels, prev, op)
            else:
                body.append(op)
        return g.replace(body=tuple(body))


def mergeable(ka: Graph, kb: Graph, la: Op, lb: Op) -> bool:
    """Whether launch ``lb`` may run in the same kernel as ``la`` (see module docstring): B reads
    nothing A writes, neither updates in place an input the other reads or writes, the launch
    shapes match, and the merged kernel still fits in shared memory."""
    written = {r.name for r in la.results}
    if any(v.name in written for v in lb.operands):
        return False
    inplace_a, inplace_b = _updated_inputs(ka, la), _updated_inputs(kb, lb)
    if inplace_a & {v.name for v in lb.operands} or inplace_b & {v.name for v in la.operands}:
        return False
    if not all(ka.attr(a) == kb.attr(a) for a in ("cluster", "threads")):
        return False
    from fusionc.codegen import smem_required
    from fusionc.ir.kernel import SMEM_LIMIT
    return smem_required(ka) + smem_required(kb) <= SMEM_LIMIT


def _updated_inputs(k: Graph, launch: Op) -> set[str]:
    """Host values that the launch of ``k`` updates in place (returned input parameters)."""
    outs = {v.name for v in k.outputs}
    return {a.name for p, a in zip(k.params, launch.operands) if p.name in outs}


def merge(kernels: dict[str, Graph], la: Op, lb: Op) -> Op:
    """One kernel running both programs; returns the launch that replaces ``la``; ``lb``."""
    ka, kb = kernels[la.attr("kernel").name], kernels[lb.attr("kernel").name]
    grid = max(ka.attr("grid"), kb.attr("grid"))
    ins, outs = {}, {}
    for k, launch in ((ka, la), (kb, lb)):
        n = len(launch.operands)
        for p, a in zip(k.params[:n], launch.operands):
            ins.setdefault(a.name, Value(a.name, p.type))
    body = []
    for k, launch, tag in ((ka, la, "a"), (kb, lb, "b")):
        names = _param_names(k, launch)
        ops = tuple(_rename(op, names, tag) for op in k.body)
        if k.attr("grid") < grid:
            ops = (
                Op(
                    "when",
                    (),
                    (),
                    lookup("when").make_attrs({"on": "cluster", "lo": 0, "hi": k.attr("grid")}),
                    (ops,),
                    k.loc,
                ),
            )
        body += ops
        for v, r in zip(k.outputs, launch.results):
            outs[r.name] = Value(names[v.name], v.type)
    pure = [v for v in outs.values() if v.name not in ins]
    name = f"{ka.name}_{kb.name}"
    attrs = dict(ka.attrs)
    attrs["grid"] = grid
    attrs["max_batch"] = max(ka.attr("max_batch"), kb.attr("max_batch"))
    kernel = Graph(
        name,
        tuple(ins.values()) + tuple(pure),
        tuple(body),
        tuple(outs.values()),
        "kernel",
        func_kind("kernel").make_attrs(attrs),
        ka.loc,
    )
    kernels[name] = kernel
    results = la.results + lb.results
    return Op(
        "launch",
        results,
        tuple(ins.values()),
        lookup("launch").make_attrs({"kernel": SymbolRef(name)}),
        (),
        la.loc,
    )


def _param_names(k: Graph, launch: Op) -> dict[str, str]:
    """Kernel parameter name -> host value name (inputs) or the launch result (pure outputs)."""
    names = {p.name: a.name for p, a in zip(k.params, launch.operands)}
    for v, r in zip(k.outputs, launch.results):
        names.setdefault(v.name, r.name)
    return names


def _rename(op: Op, names: dict[str, str], tag: str) -> Op:
    def val(v: Value) -> Value:
        return Value(names.get(v.name, f"{tag}.{v.name}"), v.type)

    return op.replace(
        results=tuple(map(val, op.results)),
        operands=tuple(map(val, op.operands)),
        regions=tuple(tuple(_rename(o, names, tag) for o in r) for r in op.regions),
    )
