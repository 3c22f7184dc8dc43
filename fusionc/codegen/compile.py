"""Compile generated CUDA to an sm_90a cubin with NVRTC (no GPU needed), through the cache."""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.codegen.context import CodegenOptions
from fusionc.codegen.generate import generate_cuda
from fusionc.codegen.source import KernelSource
from fusionc.errors import CompileError
from fusionc.ir.kernel import SMEM_LIMIT
from fusionc.ir.nodes import Graph
from fusionc.runtime import cache
from fusionc.runtime.nvrtc import KernelStats, compile_cubin

ARCH = "sm_90a"


@dataclass(frozen=True)
class CompiledKernel:
    """A generated kernel and its cubin, with ptxas statistics of its entry function."""

    source: KernelSource
    cubin: bytes
    stats: KernelStats
    log: str
    cached: bool = False

    @property
    def registers(self) -> int:
        return self.stats.registers

    @property
    def spills(self) -> int:
        """Spill stores + loads in bytes (0 for a healthy kernel)."""
        return self.stats.spills

    @property
    def smem_bytes(self) -> int:
        """Static + dynamic shared memory per CTA."""
        return self.stats.smem + self.source.smem_bytes

    def report(self) -> str:
        """One line: grid, cluster, threads, registers, shared memory, spills."""
        s = self.source
        return (f"{s.name}: grid {s.grid} x cluster {s.cluster}, {s.threads} threads, "
                f"{self.registers} registers, {self.smem_bytes} B shared memory, "
                f"{self.stats.stack} B stack, {self.spills} B spills")

    def _repr_html_(self) -> str:
        from fusionc.display import kernel_html
        return kernel_html(self)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.report())


def compile_kernel(kernel: Graph | KernelSource, options: CodegenOptions | None = None,
                   use_cache: bool = True) -> CompiledKernel:
    """Generate (if given a kernel) and compile to an sm_90a cubin.

    Raises:
        CompileError: code generation rejected the kernel, or NVRTC failed
            (``fusionc.runtime.nvrtc.NVRTCError``, a CompileError, with NVRTC's log).
    """
    src = kernel if isinstance(kernel, KernelSource) else generate_cuda(kernel, options)
    _check_smem(src, src.smem_bytes)   # before NVRTC: the dynamic part alone may not fit
    name = f"{src.name}.cu"
    if use_cache:
        result, cached = cache.compile_cached(src.source, ARCH, name=name)
    else:
        result, cached = compile_cubin(src.source, name=name, arch=ARCH), False
    stats = result.kernels.get(src.name, KernelStats(src.name))
    ck = CompiledKernel(src, result.cubin, stats, result.log, cached)
    _check_smem(src, ck.smem_bytes)   # with the static part
    return ck


def _check_smem(src: KernelSource, smem: int) -> None:
    """CompileError naming the kernel when ``smem`` bytes exceed a CTA's limit (its launch
    would fail)."""
    if smem > SMEM_LIMIT:
        k = src.kernel
        raise CompileError(f"kernel {src.name} needs {smem} B of shared memory",
                           op=k.name if k is not None else src.name,
                           loc=getattr(k, "loc", None),
                           valid=f"at most {SMEM_LIMIT} B a CTA on sm_90 (smaller sizes: "
                                 "fewer rows, a smaller hidden size, or the library path)")
