"""fusionc: a compiler of fused kernels for LLM decode on NVIDIA Hopper (sm_90a).

Decoder stages written in a small Python DSL are traced to graph IR, lowered to tile IR (work
units over every SM, a TMA-fed shared-memory ring, counters; cluster collectives over
distributed shared memory as ops), fused into persistent kernels, emitted as CUDA through Jinja
templates and compiled with NVRTC.
See README.md and docs/ARCHITECTURE.md.

The DSL (``fusionc.graph``, ``fusionc.linear``, ``fusionc.f16``, ...), the interpreter
(``fusionc.interpret``), the simulator (``fusionc.simulate``) and the GPU compiler
(``fusionc.compile``, ``fusionc.jit``) are imported on first use, so that ``import fusionc`` stays
fast; so are the subpackages (``fusionc.ir``, ``fusionc.passes``, ...).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

from fusionc import errors  # noqa: E402,F401

if TYPE_CHECKING:  # the lazy exports below, spelled out for IDEs and type checkers
    from fusionc import (codegen, comm, cost, dsl, interp, ir, lower, models,  # noqa: F401
                         passes, runtime, sim, tune)
    from fusionc.dsl import (ElemType, Tensor, Tracer, add, all_reduce, bf16,  # noqa: F401
                             cast, chunk_attention, decode_attention, dtype, f16, f32, f64,
                             graph, head_linear, kv_cache_write, embedding,
                             i32, i64, kv_cache_append, latent_cache_append, linear,
                             load_file, merge_heads, mla_decode_attention, module, mul,
                             reshape, rms_norm, rope, silu, silu_mul, split, split_heads,
                             trace)
    from fusionc.interp.interpreter import interpret  # noqa: F401
    from fusionc.runtime.compiled import compile  # noqa: F401
    from fusionc.runtime.jit import jit  # noqa: F401
    from fusionc.sim import simulate  # noqa: F401

_DSL_NAMES = frozenset({
    "graph", "module", "trace", "load_file", "add", "cast", "linear", "merge_heads", "mul",
    "reshape", "rms_norm", "silu", "silu_mul", "split", "split_heads", "all_reduce",
    "decode_attention", "kv_cache_append", "rope", "head_linear", "latent_cache_append",
    "chunk_attention", "kv_cache_write", "embedding",
    "mla_decode_attention", "ElemType", "Tensor", "bf16", "dtype", "f16",
    "f32", "f64", "i32", "i64", "Tracer"})


_SUBPACKAGES = frozenset({"ir", "passes", "codegen", "runtime", "sim", "interp", "dsl", "models",
                          "lower", "cost", "tune", "comm"})


__all__ = sorted(_DSL_NAMES | {"interpret", "compile", "jit", "simulate", "errors"})


def __getattr__(name):
    """Lazy exports: DSL names from ``fusionc.dsl``, ``interpret`` from ``fusionc.interp``."""
    if name in _DSL_NAMES:
        from fusionc import dsl
        return getattr(dsl, name)
    if name == "interpret":
        from fusionc.interp.interpreter import interpret
        return interpret
    if name == "compile":
        from fusionc.runtime.compiled import compile
        return compile
    if name == "jit":
        from fusionc.runtime.jit import jit
        return jit
    if name == "simulate":
        from fusionc.sim import simulate
        return simulate
    if name in _SUBPACKAGES:  # fusionc.ir.print_module(...) after a bare ``import fusionc``
        import importlib
        return importlib.import_module(f"fusionc.{name}")
    raise AttributeError(f"module 'fusionc' has no attribute '{name}'")


def __dir__():
    return sorted(set(globals()) | _DSL_NAMES | _SUBPACKAGES |
                  {"interpret", "compile", "jit", "simulate"})
