"""The collective idiom of tile IR: store to shared memory, barrier, collective, barrier.

The trailing barrier is what lets the buffer be reused and the CTA exit (fusionc.sim.state);
consecutive collectives on different buffers share barriers where the rules allow.
"""
from __future__ import annotations

from fusionc.ir.nodes import Value
from fusionc.lower.builder import KernelBuilder


def all_reduce(b: KernelBuilder, x: Value, op: str = "sum", hint: str = "red") -> Value:
    """ClusterReduce of tile ``x``: every CTA gets the reduction over the cluster."""
    buf = b.smem(x.type, hint=hint + "_buf")
    b.op("smem_store", buf, x)
    b.op("cluster_barrier")
    out = b.op("cluster_reduce", buf, op=op, hint=hint)
    b.op("cluster_barrier")
    return out


def all_gather(b: KernelBuilder, x: Value, axis: int, size: int, hint: str = "gat") -> Value:
    """ClusterGather of tile ``x`` along ``axis``: every CTA gets the rank-ordered concat."""
    buf = b.smem(x.type, hint=hint + "_buf")
    b.op("smem_store", buf, x)
    b.op("cluster_barrier")
    shape = list(x.type.shape)
    shape[axis] *= size
    out = b.op("cluster_gather", buf, axis=axis, types=[x.type.with_shape(shape)], hint=hint)
    b.op("cluster_barrier")
    return out


def project_and_sum(b: KernelBuilder, x: Value, weight: Value, out: Value,
                    residual: Value | None, size: int, col: str) -> None:
    """Output rows split over the cluster (CTA r: rows [r·n, (r+1)·n) of ``weight``, columns
    from ``col``), the clusters' partial sums added off-chip by ``grid_reduce`` starting from the
    residual. x: [B, K] tile; weight: [N, K_total] parameter; out: [B, N] output."""
    B, n = x.type.shape[0], weight.type.shape[0] // size
    part = b.op("gemv", x, b.param(weight), row=f"{n}*rank", col=col, rows=n, hint="y")
    init = []
    if residual is not None:
        r = b.op("load", b.param(residual), offsets=["0", f"{n}*rank"], sizes=[B, n],
                 hint="res")
        init = [b.op("cast", r, dtype="f32", hint="res32")]
    b.op("grid_reduce", out, part, *init, offsets=["0", f"{n}*rank"])
