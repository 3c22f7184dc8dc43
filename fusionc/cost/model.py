"""Cost of a tile-IR kernel: bytes from global memory, bytes over DSM, FLOPs, waves, and an
estimated time on a :class:`~fusionc.cost.h200.Device`.

Per-op costs come from each op's registry entry (``OpDef.cost(op, env)``, per CTA, with the
cluster size in ``env["C"]`` and the KV length in ``env["S"]``). The kernel estimate is
    waves · (bytes / grid) · resident clusters / (copy bandwidth · efficiency)
    + waves · Σ collectives · anchor latency(C, payload)
    + Σ grid_reduce tails (the last CTA reads every cluster's partial window alone; on resident
      grids every contributor reads one window's worth, codegen's parallel sum) + launch,
with efficiency = min(1, bytes in flight on the chip / (memory latency · bandwidth)) (Little's
law: resident CTAs × threads × loads in flight per thread): a partial last wave costs a whole
wave, and a grid with too few resident threads reaches only part of the bandwidth —
a roofline with the anchors' measured collective latencies; autotuning on the GPU replaces it
where measurements exist.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from fusionc.cost.h200 import H200, Device
from fusionc.ir.nodes import Graph, Op
from fusionc.ir.registry import Cost, lookup


@dataclass(frozen=True)
class KernelCost:
    """Whole-kernel totals (all CTAs) and the estimate."""

    name: str
    grid: int
    cluster: int
    ctas: int
    waves: int
    global_bytes: int
    dsm_bytes: int
    flops: int
    collectives: int
    est_s: float

    def row(self) -> str:
        return (f"{self.name:<24} {self.grid:>5} {self.cluster:>3} {self.ctas:>5} {self.waves:>5}"
                f" {self.global_bytes / 1e6:>9.2f} {self.dsm_bytes / 1e3:>9.1f}"
                f" {self.flops / 1e9:>8.3f} {self.collectives:>5} {self.est_s * 1e6:>8.1f}")

    HEADER = (f"{'kernel':<24} {'grid':>5} {'C':>3} {'CTAs':>5} {'waves':>5} {'global MB':>9}"
              f" {'DSM KB':>9} {'GFLOP':>8} {'coll':>5} {'est µs':>8}")


def kernel_cost(k: Graph, batch: int = 1, kv_len: int = 4096, device: Device = H200,
                smem: int | None = None) -> KernelCost:
    """Cost of kernel ``k`` at ``batch`` rows and ``kv_len`` cached tokens; ``smem`` is the
    shared memory per CTA when known (from code generation), for the occupancy."""
    from fusionc.ir.ops.tile_units import units_op
    if units_op(k) is not None:
        return streamed_cost(k, batch, device)
    grid, size = k.attr("grid"), k.attr("cluster")
    env = {"C": size, "S": kv_len, **{d: batch for p in k.params for d in p.type.shape
                                       if isinstance(d, str)}}
    total, coll_s, n_coll = Cost(), 0.0, 0
    for op, ctas_per_cluster in _ops_with_share(k.body, size):
        d = lookup(op.name)
        c = d.cost(op, env) if d.cost is not None else Cost()
        if "graph" in d.where:  # a graph op on tiles: its operands are on chip
            c = Cost(flops=c.flops)
        scale = grid * ctas_per_cluster
        total = total + Cost(c.bytes_read * scale, c.bytes_written * scale, c.flops * scale,
                             c.dsm_bytes * scale)
        if op.name in ("cluster_reduce", "cluster_gather"):
            n_coll += 1
            coll_s += device.collective_time(size, op.operands[0].type.nbytes(env))
        if op.name == "grid_barrier":
            coll_s += device.grid_reduce_s
        if op.name == "grid_reduce":  # the last-arriving CTA reads every contribution alone
            window = op.operands[1].type.numel(env) * 4  # (grid windows); on resident grids
            # (resident at one CTA per SM: kernels resident only at two take the parallel sum
            # too, but counting their tail as serial kept the choices measured best on an
            # H200, e.g. Llama-3-8B MLP batch 4: 64 clusters of 2 at 110 µs, 32 of 4 at 130)
            reads = window if device.resident(grid, size) else grid * window  # each reads one
            coll_s += reads / device.cta_l2_bandwidth + device.grid_reduce_s
    resident = device.resident_clusters.get(size, device.sms // size) * \
        ctas_per_sm(k, device, smem)
    waves = math.ceil(grid / resident)
    active = min(grid, resident)
    # bandwidth by Little's law: bytes in flight over the whole chip / memory latency
    from fusionc.codegen.ops_compute import auto_unroll
    per_thread = 16 * auto_unroll(min(batch, 16))  # the gemv's 16-byte loads in flight
    in_flight = active * size * k.attr("threads") * per_thread
    eff = min(1.0, in_flight / (device.load_latency_s * device.copy_bandwidth))
    # every wave takes as long as one cluster's share at the bandwidth of a full wave
    t_mem = waves * (total.bytes / grid) * active / (device.copy_bandwidth * eff)
    est = t_mem + coll_s * waves + device.launch_s
    return KernelCost(k.name, grid, size, grid * size, waves, total.bytes, total.dsm_bytes,
                      total.flops, n_coll, est)


def streamed_cost(k: Graph, batch: int = 1, device: Device = H200) -> KernelCost:
    """Cost of a streamed persistent kernel (design v2): every tile it streams once (the
    ``acc_gemv`` tile of each unit of every phase: weight rows and the batch's activation
    rows), each phase's output once, at the copy bandwidth over every resident CTA, plus the launch — the ring keeps the
    stream running, so no latency term (design v2 §2's measurement: 85–97% of the floor on
    large weights)."""
    read = written = flops = 0
    from fusionc.ir.ops.tile_units import phases_of
    for units in phases_of(k):   # every phase
        gemv = next(op for op in units.regions[0] if op.name == "acc_gemv")
        n, kk = gemv.attr("n"), gemv.attr("k")
        item = gemv.operands[2].type.dtype.itemsize
        flush = next(op for op in units.regions[0] if op.name == "group_flush")
        out = flush.operands[1].type
        heads = n // gemv.attr("head_rows") if gemv.attr("head_rows") else 1   # per head
        read += n * kk * item + batch * heads * kk * item
        written += batch * math.prod(out.shape[1:]) * out.dtype.itemsize
        flops += 2 * batch * n * kk
    grid = k.attr("grid")
    est = (read + written) / device.copy_bandwidth + device.launch_s
    return KernelCost(k.name, grid, 1, grid, 1, read + written, 0, flops, 0, est)


def ctas_per_sm(k: Graph, device: Device = H200, smem: int | None = None) -> int:
    """CTAs of ``k`` one SM can hold: limited by shared memory (each CTA also takes the
    hardware's reserved 1 KB: CUDA programming guide, "Shared Memory" of compute capability
    9.0), by 2048 threads per SM, and by registers (assumed <= 128 per thread until NVRTC
    reports them: 65536 per SM)."""
    from fusionc.ir.kernel import smem_bytes
    threads = k.attr("threads")
    per_cta = (smem if smem is not None else smem_bytes(k)) + device.smem_reserved_per_block
    by_smem = device.smem_per_sm // per_cta
    return max(1, min(by_smem, 2048 // threads, 65536 // (128 * threads)))


def _ops_with_share(ops, size: int, share: float = None):
    """Each op with the number of CTAs per cluster that run it (``when`` on rank narrows it)."""
    share = size if share is None else share
    for op in ops:
        if op.name == "when":
            inner = share
            if op.attr("on") == "rank":
                inner = max(0, min(op.attr("hi"), size) - op.attr("lo"))
            yield from _ops_with_share(op.regions[0], size, inner)
        else:
            yield op, share


def cost_table(kernels: list[Graph], batch: int = 1, kv_len: int = 4096) -> str:
    """A text table of :func:`kernel_cost` for each kernel."""
    rows = [KernelCost.HEADER] + [kernel_cost(k, batch, kv_len).row() for k in kernels]
    return "\n".join(rows)


def op_cost(op: Op, env: dict) -> Cost:
    """The registry cost of one op (zero when it has none)."""
    d = lookup(op.name)
    return d.cost(op, env) if d and d.cost else Cost()
