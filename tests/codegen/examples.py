"""The fused kernels of the examples (DSL -> default pass pipeline), for codegen and GPU tests."""
from __future__ import annotations

import functools
import pathlib

from fusionc.codegen import generate_cuda
from fusionc.errors import CompileError

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


@functools.lru_cache(maxsize=None)
def fused_module(example: str):
    """The module of ``examples/<example>.py`` after the v2 pipeline at a batch bucket of 8
    (an MLA example: its default pipeline, the MLA units)."""
    from fusionc.dsl.loader import load_file
    from fusionc.passes import DEFAULT_PIPELINE, parse_pipeline, run_pipeline
    from fusionc.runtime.pipelines import v2_default_pipeline
    m = load_file(str(EXAMPLES / f"{example}.py"))
    mla = [g for g in m.graphs if any(op.name == "mla_decode_attention" for op in g.body)]
    pipeline = v2_default_pipeline(mla[0], 8) if mla else DEFAULT_PIPELINE
    return run_pipeline(m, parse_pipeline(pipeline))


def example_kernels(example: str) -> list[str]:
    return [g.name for g in fused_module(example).graphs if g.kind == "kernel"]


def fitting_kernel(example: str, name: str, batch: int = 1):
    """The kernel, with ``max_batch`` lowered to ``batch`` when its tiles at the lowered
    max_batch do not fit in shared memory (returns (kernel, whether it was lowered))."""
    k = fused_module(example)[name]
    try:
        generate_cuda(k)
        return k, False
    except CompileError as e:
        if "shared memory" not in str(e):
            raise
    attrs = tuple((a, batch if a == "max_batch" else v) for a, v in k.attrs)
    return k.replace(attrs=attrs), True
