"""The fusionc DSL: trace Python functions over symbolic tensors into graph IR.

    import fusionc as fc
    from fusionc import f16, i32

    @fc.graph
    def mlp(x: f16["B", 4096], norm_w: f16[4096], w_gate_up: f16[22016, 4096],
            w_down: f16[4096, 11008]):
        h = fc.rms_norm(x, norm_w, 1e-5)
        gate, up = fc.split(fc.linear(h, w_gate_up), [11008, 11008])
        return x + fc.linear(fc.silu_mul(gate, up), w_down)

``mlp`` is then a :class:`fusionc.ir.Module` with one graph ``@mlp``; every op carries the
``file:line`` that created it. See the tour in README.md.
"""
from fusionc.dsl.graph import graph, module, trace
from fusionc.dsl.loader import load_file
from fusionc.dsl.ops_basic import (add, cast, embedding, linear, merge_heads, mul, reshape,
                                   rms_norm, silu, silu_mul, split, split_heads)
from fusionc.dsl.ops_decoder import (all_reduce, chunk_attention, decode_attention,
                                     kv_cache_append, kv_cache_write, rope)
from fusionc.dsl.ops_mla import head_linear, latent_cache_append, mla_decode_attention
from fusionc.dsl.spec import ElemType, Tensor, bf16, dtype, f16, f32, f64, i32, i64
from fusionc.dsl.tensor import Tracer

__all__ = ["graph", "module", "trace", "load_file", "add", "cast", "linear", "merge_heads",
           "mul", "reshape", "rms_norm", "silu", "silu_mul", "split", "split_heads",
           "all_reduce", "decode_attention", "kv_cache_append", "rope", "head_linear",
           "chunk_attention", "kv_cache_write", "embedding",
           "latent_cache_append", "mla_decode_attention", "ElemType", "Tensor",
           "bf16", "dtype", "f16", "f32", "f64", "i32", "i64", "Tracer"]
