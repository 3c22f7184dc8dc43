"""Pass ``lower-library``: linear layers over many tokens become library calls —
``linear(x, w)`` → ``library_call(x, w) {fn = cublas_gemm}`` (one cuBLAS GEMM,
fp32 accumulation, a bias added by the GEMM). fusionc's fused kernels are for decode (up to
128 rows); for prefill and large batches a GEMM-class library is faster. The rest of such a
graph (RMSNorm, SiLU·mul, adds, splits) runs as row kernels
(:mod:`fusionc.runtime.row_kernels`; splits as views), RoPE, KV appends and writes and the
attentions left on the host as :mod:`fusionc.runtime.library_attention`'s kernels (the caches
in place), and the collectives as fusionc's all-reduce kernels
(:mod:`fusionc.runtime.host_ops`).
"""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.ir.nodes import Graph, Module, Op
from fusionc.ir.registry import lookup
from fusionc.passes.base import Pass, register_pass


@register_pass
@dataclass(frozen=True)
class LowerLibrary(Pass):
    """See the module docstring."""

    name = "lower-library"

    def run(self, module: Module) -> Module:
        return Module(tuple(self.rewrite(g) if g.kind == "graph" else g
                            for g in module.graphs))

    def rewrite(self, g: Graph) -> Graph:
        """``g`` with every linear as a cuBLAS library call. LoweringError for a KV cache that
        a host append or write (in place) leaves readable under its old name
        (:func:`fusionc.lower.attention_v2.refuse_in_place_reads`)."""
        from fusionc.lower.attention_v2 import refuse_in_place_reads
        refuse_in_place_reads(g)
        call = lookup("library_call")

        def attrs(op):   # the linear's out_dtype carries over
            return call.make_attrs({"fn": "cublas_gemm"} | {
                k: v for k, v in op.attrs if k == "out_dtype" and v is not None})
        return g.replace(body=tuple(
            Op("library_call", op.results, op.operands, attrs(op), loc=op.loc)
            if op.name == "linear" else op for op in g.body))
