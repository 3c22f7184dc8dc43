"""The state shared by the op emitters while one kernel is generated."""
from __future__ import annotations

from dataclasses import dataclass, field

from fusionc.codegen.layout import SmemPlan
from fusionc.codegen.refs import Ref
from fusionc.codegen.render import render
from fusionc.ir.nodes import Graph, Op, Value


@dataclass(frozen=True)
class CodegenOptions:
    """Code generation options.

    Attributes:
        delay: debug build for tests: the kernel takes two extra arguments (``fc_delay_rank``,
            ``fc_delay_ns``) and the CTA of that rank spins before each shared-memory store
            and each collective, to expose missing barriers.
        gemv_unroll: 16-byte weight loads each thread keeps in flight in gemv (2..16); 0 picks
            by the batch rows held in registers: 16 up to 4 rows, 8 up to 8, else 4 (measured
            on an H200, 2026-11-29: BENCHMARKS.md, sweep).
        pdl: programmatic dependent launch: the kernel starts while its predecessor in the
            stream drains, prefetches its first weight rows into L2 and waits for the
            predecessor before anything else (``fusionc.codegen.pdl``); launched with the
            programmatic-stream-serialization attribute.
        load_batch: 16-byte global loads each thread issues before storing them, in the tile
            ``load`` (1: one per iteration; each iteration's load then waits for the previous
            iteration's shared-memory store). Larger values keep more loads in flight; not
            yet measured on the GPU, hence off by default.
        timeline: profiling build: thread 0 of every CTA stores ``%globaltimer`` (ns) at entry
            (slot 0), at each grid_barrier k's arrival and release (slots 2k + 1, 2k + 2) and at
            exit (slot 15) into the last ``CTAs x 16`` 64-bit words of the kernel's counters
            (``scripts/mla_timeline.py`` reads them), to split a persistent kernel's phases.
    """

    delay: bool = False
    gemv_unroll: int = 0
    pdl: bool = False
    timeline: bool = False
    load_batch: int = 1


@dataclass
class Workspace:
    """Global scratch a kernel needs beyond its parameters (grid_reduce partials, counters)."""

    floats: int = 0
    counters: int = 0


@dataclass
class EmitCtx:
    """What emitters see: the kernel, its shared-memory plan, value references, options, and
    the places where they add file-scope declarations and global workspace."""

    kernel: Graph
    plan: SmemPlan
    options: CodegenOptions
    op_index: dict[int, int]
    refs: dict[str, Ref] = field(default_factory=dict)
    decls: list[str] = field(default_factory=list)
    libs: set[str] = field(default_factory=lambda: {"common"})
    workspace: Workspace = field(default_factory=Workspace)
    barriers: int = 0  # grid_barrier ops emitted so far (their timeline slots)
    _uid: int = 0

    @property
    def threads(self) -> int:
        return self.kernel.attr("threads")

    @property
    def cluster(self) -> int:
        return self.kernel.attr("cluster")

    @property
    def grid(self) -> int:
        return self.kernel.attr("grid")

    @property
    def max_batch(self) -> int:
        return self.kernel.attr("max_batch")

    def ref(self, v: Value) -> Ref:
        """Where value ``v`` lives."""
        return self.refs[v.name]

    def index(self, op: Op) -> int:
        """The op's position in program order (regions flattened)."""
        return self.op_index[id(op)]

    def scratch(self, op: Op) -> str:
        """A ``unsigned char*`` C expression for the op's shared-memory scratch."""
        off, _ = self.plan.scratch[self.index(op)]
        return f"(fc_smem + {off})"

    def uid(self, prefix: str) -> str:
        """A fresh C identifier starting with ``prefix``."""
        self._uid += 1
        return f"{prefix}{self._uid}"

    def need(self, lib: str) -> None:
        """Include ``templates/lib/<lib>.cuh.j2`` in the kernel source."""
        self.libs.add(lib)

    def delay(self) -> str:
        """The debug spin statement (empty unless the ``delay`` option is on)."""
        return ("fc_debug_delay(fc_rank, fc_delay_rank, fc_delay_ns);\n"
                if self.options.delay else "")

    def render(self, template: str, **kw) -> str:
        return render(template, **kw)
