"""``run_kernel``: the GPU counterpart of ``fusionc.sim.simulate_kernel``."""
from __future__ import annotations

import numpy as np

from fusionc.codegen.compile import CompiledKernel, compile_kernel
from fusionc.codegen.context import CodegenOptions
from fusionc.ir.nodes import Graph
from fusionc.ir.types import bind_shapes
from fusionc.runtime.launch import LoadedKernel
from fusionc.runtime.transfer import download, nan_bits, upload

_LOADED: dict[str, LoadedKernel] = {}


def load(kernel: Graph | CompiledKernel, options: CodegenOptions | None = None) -> LoadedKernel:
    """Compile (through the cubin cache) and load a kernel, once per process and source."""
    ck = kernel if isinstance(kernel, CompiledKernel) else compile_kernel(kernel, options)
    key = ck.source.source
    if key not in _LOADED:
        _LOADED[key] = LoadedKernel(ck)
    return _LOADED[key]


def pure_outputs(kernel: Graph) -> list[str]:
    """Returned parameters that no op reads and no kv_append updates in place: written by
    ``store`` / ``grid_reduce`` only, so poisoned with NaN before the launch."""
    keep = set()
    for op in kernel.walk():
        written = {0} if op.name in ("store", "grid_reduce") else set()
        keep.update(v.name for i, v in enumerate(op.operands) if i not in written)
    return [v.name for v in kernel.outputs if v.name not in keep]


def bind_dims(kernel: Graph, args: dict) -> dict[str, int]:
    """Symbolic dims from argument shapes; InputError on a missing or ill-shaped argument."""
    return bind_shapes(kernel.params, {k: np.shape(v) for k, v in args.items()}, kernel.name)


def run_kernel(kernel: Graph, args: dict[str, np.ndarray],
               options: CodegenOptions | None = None, delay: tuple[int, int] = (-1, 0),
               repeat: int = 1, poison: bool = True) -> dict[str, np.ndarray]:
    """Run ``kernel`` on the GPU: upload ``args`` (every parameter, rounded to its dtype),
    fill pure outputs (:func:`pure_outputs`) with NaN unless ``poison`` is false (for kernels
    that write only part of an output), launch ``repeat`` times on the current stream,
    synchronize and return the kernel's outputs by name (numpy, ``DType.numpy``; bf16 as
    float32). ``delay`` = (rank, ns) for debug builds (``CodegenOptions(delay=True)``).

    Raises:
        InputError: missing or ill-shaped arguments, a symbolic dim over max_batch.
        CompileError: code generation or NVRTC failed. DeviceError: no sm_90 GPU, or a CUDA
            call failed.
    """
    import cupy
    dims = bind_dims(kernel, args)
    lk = load(kernel, options)
    poisoned = set(pure_outputs(kernel)) if poison else set()
    dev = {}
    for p in kernel.params:
        dev[p.name] = upload(args[p.name], p.type.dtype)
        if p.name in poisoned:
            dev[p.name].fill(nan_bits(p.type.dtype))
    for _ in range(repeat):
        lk.launch(dev, dims, delay)
    cupy.cuda.get_current_stream().synchronize()
    return {v.name: download(dev[v.name], v.type.dtype) for v in kernel.outputs}
