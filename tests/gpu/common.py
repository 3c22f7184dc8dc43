"""Helpers of the GPU tests: exact bit comparison, error norms, a results table, and the list
of kernels to compile ahead (``python -m tests.gpu.precompile`` fills the cubin cache on a
machine without a GPU; the GPU machine then only loads and runs)."""
from __future__ import annotations

import numpy as np

from fusionc.interp.numerics import relative_error
from fusionc.ir import DType, parse_module
from fusionc.runtime.transfer import host_to_device_bits

RESULTS: list[tuple[str, str, str]] = []  # (test, case, outcome) for the summary table
PRECOMPILE: list = []  # (kernel text, verify, CodegenOptions kwargs)


def record(test: str, case: str, outcome: str) -> None:
    RESULTS.append((test, case, outcome))


def kernel(text: str, verify: bool = True, **options):
    """Parse a kernel and remember it for precompilation."""
    PRECOMPILE.append((text, verify, options))
    return parse_module(text, verify=verify).graphs[0]


def bits(x: np.ndarray, dt: DType) -> np.ndarray:
    """The stored bits of ``x`` in ``dt`` as unsigned integers (NaN == NaN, -0 != 0)."""
    b = host_to_device_bits(x, dt)
    return b.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[b.itemsize])


def bit_equal(a: np.ndarray, b: np.ndarray, dt: DType) -> bool:
    return np.array_equal(bits(a, dt), bits(b, dt))


def rel(out, ref) -> float:
    """Norm-wise relative error (float64)."""
    return relative_error(out, ref)


def torch_capture(fn, tensors: dict, poison: bool = False):
    """Call ``fn(**tensors)`` twice eagerly on a side stream, then once inside a
    ``torch.cuda.graph`` capture; replay the graph (its output NaN-filled first when
    ``poison``) and return ``(eager result, captured result)`` of the first output."""
    import torch
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        (eager,) = fn(**tensors)
        fn(**tensors)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        (captured,) = fn(**tensors)
    if poison:
        captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return eager, captured
