"""Pass ``attention-units``: each attention core of a graph (the ops from a QKV projection's
output to the attention output, :func:`fusionc.lower.attention_v2.attention_cores`) becomes
one ``attn_units`` kernel and the ``launch`` of it; every other op stays. ``partition-units``
runs the same rewrite among its linear kernels; alone, before ``lower-library``, it gives the
mixed path of batches past the fused linears' bucket: the linears as GEMMs, the attention
core on the units. With ``host``, an attention the units do not take (another form, a head_dim
past their registers) stays too, for the host's library kernels
(:mod:`fusionc.runtime.library_attention`).

Before::

    %qkv = linear(%h, %w_qkv)
    %q, %k, %v = split(%qkv) ...  rope ... kv_cache_append ... decode_attention ... reshape

After::

    %qkv = linear(%h, %w_qkv)
    %o_flat, %k_cache.1, %v_cache.1 = launch(%qkv, %k_cache, %v_cache, %positions,
                                             %seq_lens) {kernel = @attention_k3}
"""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.errors import LoweringError, PassError
from fusionc.ir.nodes import Graph, Module, Op, SymbolRef
from fusionc.ir.registry import lookup
from fusionc.passes.base import Pass, register_pass


def core_kernel(core, name: str, made: set, max_batch: int) -> tuple[Graph, Op]:
    """The units kernel of ``core`` (an attention core: ``attn_units``; an MLA core:
    ``mla_units``) and the op launching it; ``made`` (the names computed so far) gains its
    results. LoweringError when the kernel would read a value that another kernel absorbed."""
    from fusionc.lower import attention_v2, mla_v2
    lower = mla_v2.lower_core if isinstance(core, mla_v2.MLACore) else attention_v2.lower_core
    k = lower(core, name, max_batch)
    ins = [v for v in k.params if v.name != core.out.name]   # o_flat is written only
    for v in ins:
        if v.name not in made:
            raise LoweringError(f"%{v.name} is folded into another kernel, but read here",
                                op=core.attention.name, loc=core.attention.loc,
                                valid="a QKV projection whose output only the attention "
                                      "core reads")
    outs = (core.out, *core.results)
    made.update(v.name for v in outs)
    attrs = lookup("launch").make_attrs({"kernel": SymbolRef(k.name)}, core.attention.loc)
    return k, Op("launch", outs, tuple(ins), attrs, (), core.attention.loc)


def unit_cores(g: Graph, host: bool = False) -> dict:
    """id(attention op) → its core, for the attention cores
    (:func:`fusionc.lower.attention_v2.attention_cores`) and the MLA cores
    (:func:`fusionc.lower.mla_v2.mla_cores`) of ``g``; LoweringError naming an attention of
    ``g`` in neither form. ``host``: only the attention cores the units take
    (:func:`fusionc.lower.attention_v2.takes`), the other attentions left to the host
    (``lower-library`` then refuses a cache read beside an in-place append)."""
    from fusionc.lower import attention_v2, mla_v2
    cores = {id(c.attention): c for c in attention_v2.attention_cores(g)
             if not host or attention_v2.takes(c)}
    if not host:
        attention_v2.refuse_unmatched(g, cores)
    mla = {id(c.attention): c for c in mla_v2.mla_cores(g)}
    mla_v2.refuse_unmatched(g, mla)
    return cores | mla


def kernel_name(g: Graph, i: int, module: Module) -> str:
    """``{graph}_k{i}``, with a suffix when the module already has an item of that name."""
    taken = set(module.names)
    name, n = f"{g.name}_k{i}", 1
    while name in taken:
        name, n = f"{g.name}_k{i}_{n}", n + 1
    return name


@register_pass
@dataclass(frozen=True)
class AttentionUnits(Pass):
    """See the module docstring."""

    name = "attention-units"
    max_batch: int = 8
    host: bool = False   # attentions the units do not take stay, for the host path

    def check_options(self) -> None:
        """PassError for a batch bucket < 1."""
        if self.max_batch < 1:
            raise PassError(f"max_batch = {self.max_batch}", op=self.name, valid=">= 1")

    def run(self, module: Module) -> Module:
        kernels, graphs = [], []
        for g in module.graphs:
            if g.kind != "graph":
                graphs.append(g)
                continue
            cores = unit_cores(g, self.host)
            absorbed = {id(o) for c in cores.values() for o in c.absorbed}
            made = {p.name for p in g.params}
            body = []
            for i, op in enumerate(g.body):
                if id(op) in cores:
                    k, launch = core_kernel(cores[id(op)], kernel_name(g, i, module), made,
                                            self.max_batch)
                    kernels.append(k)
                    body.append(launch)
                elif id(op) not in absorbed:
                    made.update(r.name for r in op.results)
                    body.append(op)
            graphs.append(g.replace(body=tuple(body)))
        return Module(tuple(kernels + graphs))
