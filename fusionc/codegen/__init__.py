"""Code generation: tile-IR kernels -> CUDA C++ through the Jinja templates in ``templates/``.

- :func:`generate_cuda` — the source and launch description of one kernel (no GPU, no NVRTC);
- :func:`compile_kernel` — that source compiled to an sm_90a cubin by NVRTC, with ptxas
  statistics (registers, shared memory, spills);
- :func:`smem_required` — the shared memory per CTA the generated code will allocate;
- :class:`CodegenOptions` — debug and tuning options.

The execution model is described in :mod:`fusionc.codegen.generate`.
"""
from fusionc.codegen.context import CodegenOptions
from fusionc.codegen.generate import generate_cuda, smem_required
from fusionc.codegen.source import KernelParam, KernelSource

__all__ = ["CodegenOptions", "CompiledKernel", "KernelParam", "KernelSource", "compile_kernel",
           "generate_cuda", "smem_required"]


def __getattr__(name):
    if name in ("compile_kernel", "CompiledKernel"):
        from fusionc.codegen import compile as _compile
        return getattr(_compile, name)
    raise AttributeError(f"module 'fusionc.codegen' has no attribute '{name}'")
