"""Configurations the generated code cannot run, rejected before NVRTC with a clear error."""
from __future__ import annotations

from fusionc.codegen import emitters
from fusionc.codegen.layout import SmemPlan
from fusionc.errors import CompileError
from fusionc.ir.kernel import CLUSTER_SIZES, SMEM_LIMIT
from fusionc.ir.nodes import Graph


def check_kernel(kernel: Graph) -> None:
    """Launch shape and per-op checks. Raises CompileError."""
    if kernel.kind != "kernel":
        raise CompileError(f"@{kernel.name} is a {kernel.kind}, not a kernel", loc=kernel.loc,
                           valid="a tile-IR kernel (lower the graph first)")
    c, t = kernel.attr("cluster"), kernel.attr("threads")
    if c not in CLUSTER_SIZES:
        raise CompileError(f"cluster size {c}", op=kernel.name, loc=kernel.loc,
                           valid="1, 2, 4, 8 or 16 CTAs per cluster (16 is the hardware limit, "
                                 "with the non-portable cluster size attribute)")
    if c == 16 and not kernel.attr("nonportable"):
        raise CompileError("cluster size 16 without nonportable = true", op=kernel.name,
                           loc=kernel.loc, valid="nonportable = true, or cluster <= 8")
    if t % 32 or not 32 <= t <= 1024:
        raise CompileError(f"{t} threads per CTA", op=kernel.name, loc=kernel.loc,
                           valid="a multiple of 32 from 32 to 1024")
    for op in kernel.walk():
        if op.name in emitters.CONTROL:
            continue
        em = emitters.get(op)
        if em.check is not None:
            em.check(op, kernel)


def check_smem(kernel: Graph, plan: SmemPlan) -> None:
    """The shared memory actually allocated must fit the 227 KB opt-in limit per CTA."""
    if plan.total <= SMEM_LIMIT:
        return
    big = sorted(plan.intervals, key=lambda iv: -iv.size)[:3]
    what = ", ".join(f"{iv.name} ({iv.size} B)" for iv in big)
    raise CompileError(
        f"needs {plan.total} bytes of shared memory per CTA (max_batch = "
        f"{kernel.attr('max_batch')}); largest: {what}", op=kernel.name, loc=kernel.loc,
        valid=f"at most {SMEM_LIMIT} bytes (227 KB): smaller tiles, a smaller max_batch, "
              "or more CTAs per cluster")
