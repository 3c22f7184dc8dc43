"""Pass ``partition-cluster``: lower attention blocks of graph IR to cluster kernels (lowering
v1).

Configurations are enumerated, lowered, and kept only if code generation can realize them
(shared memory as actually laid out); the cost model picks the cheapest.

Every attention block (found from its ``decode_attention``) of each graph becomes one tile-IR
``kernel`` item (see :mod:`fusionc.lower`), and the block's ops in the graph are replaced by one
``launch`` whose results take the names of the block's outputs (the new hidden state, the
updated KV caches). Ops outside any block stay in the graph: MLP blocks and other linears for
``partition-units`` (design v2's streamed kernels, the rest of v1's pipeline), ``all_reduce``
for the host. An MLA block (``mla_decode_attention``) is a LoweringError: lowering v1 has no MLA
kernel, lowering v2's MLA units take it (:func:`fusionc.lower.stages.refuse_mla`).

Options:
    size: cluster size C (1, 2, 4, 8, 16); 0 lets the cost model choose per block.
    scheme: ``splitk``, ``splitn`` or ``auto``: the QKV projection scheme of attention blocks
        (see :mod:`fusionc.lower.attention`).
    batch, kv_len: the batch and KV length the cost model plans for.
    max_batch: largest batch the kernels are sized for (shared memory); a compile-time bucket.
"""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.cost.model import kernel_cost
from fusionc.codegen.generate import generate_cuda
from fusionc.errors import CompileError, LoweringError, VerifyError
from fusionc.ir.nodes import Graph, Module, Op, SymbolRef, Value
from fusionc.ir.registry import lookup
from fusionc.ir.verifier import verify_graph
from fusionc.lower.attention import lower_attention
from fusionc.lower.stages import find_stages
from fusionc.passes.base import Pass, register_pass

SIZES = (1, 2, 4, 8, 16)


@register_pass
@dataclass(frozen=True)
class PartitionCluster(Pass):
    """See the module docstring."""

    name = "partition-cluster"
    size: int = 0
    scheme: str = "auto"
    batch: int = 1
    kv_len: int = 4096
    max_batch: int = 8

    def run(self, module: Module) -> Module:
        if self.size not in (0,) + SIZES:
            raise LoweringError(f"cluster size {self.size}", op=self.name,
                                valid="0 (cost model) or 1, 2, 4, 8, 16")
        if self.scheme not in ("auto", "splitk", "splitn"):
            raise LoweringError(f"scheme {self.scheme}", op=self.name,
                                valid="auto, splitk or splitn")
        if self.max_batch < 1:
            raise LoweringError(f"max_batch = {self.max_batch}", op=self.name,
                                valid="max_batch >= 1")
        items: list[Graph] = []
        taken = set(module.names)   # kernel names must not clash with a graph's (@mlp_k0)
        for g in module.graphs:
            if g.kind != "graph":
                items.append(g)
                continue
            host, kernels = self.lower_graph(g, taken)
            items += kernels + [host]
        return Module(tuple(items))

    def lower_graph(self, g: Graph, taken: set | None = None) -> tuple[Graph, list[Graph]]:
        """The host graph of launches and the kernels of graph ``g``, named ``<g>_k<i>``
        (``<g>_k<i>_<j>`` where that name is in ``taken``, which gets the names used)."""
        taken = set() if taken is None else taken
        _check_dims(g)
        replaced: dict[int, Op | None] = {}
        kernels = []
        for i, st in enumerate(find_stages(g)):
            _used_only_inside(g, st)
            _same_out_dtype(st)
            k = self.best_kernel(st, _fresh(f"{g.name}_k{i}", taken))
            inner = {r.name: op for op in st.ops for r in op.results}
            for p in k.params:
                if p.name in inner and p.name != st.out.name:  # a residual from inside
                    raise LoweringError(f"the block needs %{p.name} from inside itself",
                                        op=inner[p.name].name, loc=inner[p.name].loc,
                                        valid="inputs and residuals computed before the block")
            kernels.append(k)
            for op in st.ops:
                replaced[id(op)] = None
            replaced[id(_last(g, st.ops))] = _launch(k, st)
        body = []
        for op in g.body:
            if id(op) not in replaced:
                body.append(op)
            elif replaced[id(op)] is not None:
                body.append(replaced[id(op)])
        return g.replace(body=tuple(body)), kernels

    def best_kernel(self, st, name: str) -> Graph:
        """Lower ``st`` for every allowed configuration and keep the cheapest by the cost
        model (only the given one when ``size`` and ``scheme`` are fixed)."""
        options, errors = [], []
        for cfg in self.configs(st):
            try:
                k = self.lower(st, name, *cfg)
                verify_graph(k)  # e.g. shared memory over the limit at this max_batch
                smem = generate_cuda(k).smem_bytes  # what codegen really allocates
                options.append((kernel_cost(k, self.batch, self.kv_len, smem=smem).est_s, k))
            except (LoweringError, VerifyError, CompileError) as e:
                errors.append(e)
        if not options:   # configs() gives at least one
            e = errors[0]   # the first configuration tried
            raise LoweringError(f"no configuration fits: {e.message}", op=e.op or self.name,
                                loc=st.ops[0].loc, valid=e.valid or "a smaller max_batch")
        return min(options, key=lambda t: t[0])[1]

    def configs(self, st):
        """Candidate configurations of an attention stage: (cluster size, scheme)."""
        sizes = SIZES if self.size == 0 else (self.size,)
        schemes = ("splitk", "splitn") if self.scheme == "auto" else (self.scheme,)
        return [(c, s) for c in sizes for s in schemes]

    def lower(self, st, name, size, scheme) -> Graph:
        """The tile-IR kernel of ``st`` for one configuration (LoweringError if sizes do not
        divide).
        """
        return lower_attention(st, name, size, scheme, self.max_batch)


def _used_only_inside(g: Graph, st) -> None:
    """LoweringError if a value computed inside the block (other than its output and the updated
    caches) is used after it or returned: the block's ops leave the graph."""
    inner = {id(op) for op in st.ops}
    keep = {st.out.name} | {v.name for v in st.in_place.values()}
    made = {r.name: op for op in st.ops for r in op.results if r.name not in keep}
    outside = [v.name for op in g.body if id(op) not in inner for v in op.operands]
    for name in outside + [v.name for v in g.outputs]:
        if name in made:
            op = made[name]
            raise LoweringError(f"%{name} is computed inside the fused block and also used "
                                "outside it", op=op.name, loc=op.loc,
                                valid="use only the block's output and its updated caches "
                                      "after the block")


INT32_MAX = 2**31 - 1


def _check_dims(g: Graph) -> None:
    """Kernels index with 32-bit sizes and specialize every dim but the leading batch."""
    for p in g.params:
        for i, d in enumerate(p.type.shape):
            if isinstance(d, str) and i != 0:
                raise LoweringError(f"dim {i} of %{p.name}: {p.type} is symbolic ({d})",
                                    op=g.name, loc=g.loc,
                                    valid="static sizes; only the leading batch dim may be "
                                          "symbolic")
            if isinstance(d, int) and d > INT32_MAX:
                raise LoweringError(f"dim {i} of %{p.name}: {p.type} exceeds 2^31 - 1",
                                    op=g.name, loc=g.loc, valid="sizes below 2^31")


def _last(g: Graph, ops) -> Op:
    ids = {id(o) for o in ops}
    return [op for op in g.body if id(op) in ids][-1]


def _launch(k: Graph, st) -> Op:
    # pure outputs (the block's output, workspaces) follow the inputs and are not arguments
    n_in = len(k.params) - sum(1 for v in k.outputs if v.name not in st.in_place)
    args = tuple(p for p in k.params[:n_in])
    # the block's output, inputs updated in place (caches), or a workspace no op reads
    results = [st.out if v.name == st.out.name else st.in_place.get(v.name, v)
               for v in k.outputs]
    return Op("launch", tuple(results), args,
              lookup("launch").make_attrs({"kernel": SymbolRef(k.name)}), (), k.loc)


__all__ = ["PartitionCluster", "Value"]


def _fresh(name: str, taken: set) -> str:
    """``name``, or ``name_1``, ``name_2``, ... when taken; the result is added to ``taken``."""
    out, j = name, 0
    while out in taken:
        j += 1
        out = f"{name}_{j}"
    taken.add(out)
    return out


def _same_out_dtype(st) -> None:
    """LoweringError for a linear of a block whose result dtype is not its x's (``out_dtype``):
    the cluster kernels keep one dtype through a block."""
    for op in st.ops:
        if op.name == "linear" and op.results[0].type.dtype != op.operands[0].type.dtype:
            raise LoweringError(f"out_dtype {op.results[0].type.dtype.value} inside a "
                                "cluster-kernel block", op=op.name, loc=op.loc,
                                valid="out_dtype equal to x's dtype on lowering v1; other "
                                      "out_dtypes on lowering v2 (linear layers of their own)")
