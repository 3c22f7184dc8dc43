"""What code generation hands to the compiler and the runtime."""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.ir.nodes import Graph, Value


@dataclass(frozen=True)
class KernelParam:
    """One argument of the generated ``__global__`` function, in order.

    ``kind``: ``tensor`` (a kernel parameter: device pointer, ``value`` is the IR parameter),
    ``dim`` (an ``int``: the run-time size of symbolic dim ``symbol``), ``workspace``
    (``float*`` global scratch of ``KernelSource.workspace_floats`` floats), ``counters``
    (``unsigned*``, ``KernelSource.counters`` arrival counters, zeroed once by the runtime and
    left zero by every launch), ``delay_rank`` / ``delay_ns`` (debug builds only).
    """

    name: str
    kind: str
    decl: str
    value: Value | None = None
    symbol: str | None = None
    box: tuple[int, ...] = ()
    lead: int = 1   # tensormap: leading dims that form the rows (fusionc.stream.ring.matrix_lead)


@dataclass(frozen=True)
class KernelSource:
    """Generated CUDA C++ for one tile-IR kernel and how to launch it.

    ``grid`` is the number of clusters; the launch has ``grid * cluster`` CTAs in x, cluster
    dims ``(cluster, 1, 1)``, ``threads`` threads per CTA and ``smem_bytes`` of dynamic shared
    memory. ``cluster_dims_in_source`` says whether the source fixes the cluster size with
    ``__cluster_dims__`` (sizes <= 8); otherwise the launch must pass it (size 16, with the
    non-portable cluster size attribute set on the function).
    """

    name: str
    source: str
    kernel: Graph
    grid: int
    cluster: int
    threads: int
    smem_bytes: int
    params: tuple[KernelParam, ...]
    workspace_floats: int = 0
    counters: int = 0
    delay: bool = False
    pdl: bool = False   # launch with programmatic stream serialization (fusionc.codegen.pdl)
    stamps: tuple[str, ...] = ()  # timeline slot labels (CodegenOptions.timeline)
    stamp_base: int = 0  # first counter word of the timeline slots
    resident: bool = False  # needs every CTA resident at once (grid barrier, parallel reduce,
    #                          phases of a persistent kernel that wait on each other)
    # a streamed persistent kernel of this many work units: launched on min(resident CTAs,
    # units, grid) CTAs (fusionc.stream.UnitSchedule); 0 for a fixed grid
    persistent_units: int = 0

    @property
    def blocks(self) -> int:
        """CTAs in the launch."""
        return self.grid * self.cluster

    @property
    def nonportable(self) -> bool:
        return self.cluster > 8

    @property
    def cluster_dims_in_source(self) -> bool:
        return 1 < self.cluster <= 8

    def summary(self) -> str:
        """One line: name, grid, cluster, threads, shared memory."""
        return (f"{self.name}: grid {self.grid} x cluster {self.cluster} ({self.blocks} CTAs), "
                f"{self.threads} threads, {self.smem_bytes} B dynamic shared memory")
