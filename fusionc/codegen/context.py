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
        gemv_mma_batch: batch rows (per weight read, at the kernel's ``max_batch``) from which
            gemv runs on tensor cores (``mma.sync`` m16n8k16, weights as M, batch rows as N)
            when x and the weights share a 16-bit dtype; 0 keeps CUDA-core FMA everywhere.
            docs/ARCHITECTURE.md: from 4 rows the FMA path is compute-bound.
        gemv_mma_pipeline: 1: in kernels built for one CTA per SM, the tensor-core gemv
            issues the next block of weight loads before using the current one (two blocks
            of ``gemv_unroll / 4`` k-steps in flight); elsewhere, and with 0, one block of
            ``gemv_unroll / 2`` k-steps at a time (fewer registers); 2: pipelined always.
        attn_stream: 2: attn_partial streams K/V rows straight into registers, lanes across
            head_dim (FlashDecoding on CUDA cores), where head_dim splits into a power of two
            of at most 32 16-byte vectors and q and o fit 2 x 32 registers (G <= 4 in f16
            and bf16, G <= 8 in f32), with the next tokens' loads issued before the current
            ones are used when G < 4 (``stream_pipelined``); 1: streamed without the
            prefetch; 0: the shared-memory staged path (a thread per (query head, token))
            everywhere.
        attn_tokens: tokens per block of a lane group in the streamed attention (K and V
            loads in flight per lane: twice that); 0: by the kernel's occupancy
            (``ops_attention.stream_tokens``): 8 at one CTA of at most 256 threads per SM, else
            4, or 2 from 7 query heads per KV head (128 registers at two CTAs per SM).
        grid_reduce_parallel: 1: where the whole grid is resident on an H200 (at most
            ``blocks x H200.resident_clusters[cluster]`` clusters, ``blocks`` the kernel's
            CTAs per SM), grid_reduce's contributors meet at a grid barrier and each sums a
            share of the output (the same sums in the same order as the last CTA alone, which
            stays the method otherwise, and with 0). Such kernels are refused at load where the
            driver's occupancy query (``cuOccupancyMaxActiveClusters``) holds fewer clusters
            than the grid (a GPU with fewer SMs, for one), and, like any grid
            barrier, trap after 2 s if other work (MPS, another process) keeps some of their
            CTAs off the GPU that long: use 0 where the GPU is shared.
        pdl: programmatic dependent launch: the kernel starts while its predecessor in the
            stream drains, prefetches its first weight rows into L2 and waits for the
            predecessor before anything else (``fusionc.codegen.pdl``); launched with the
            programmatic-stream-serialization attribute.
        load_batch: 16-byte global loads each thread issues before storing them, in the tile
            ``load`` (1: one per iteration; each iteration's load then waits for the previous
            iteration's shared-memory store). Larger values keep more loads in flight; 4 was
            within noise of 1 on lowering v1's MLA kernel (since deleted; H200, 2026-11-30),
            hence off by default.
        timeline: profiling build: after a ``__syncthreads()``, thread 0 of every CTA stores
            ``%globaltimer`` (ns) at entry, after every top-level op, at each grid_barrier's
            arrival and release, and at exit, into 64-bit slots after the kernel's other
            counters (``KernelSource.stamps`` names the slots; ``fusionc.runtime.timeline``
            reads them), to split a fused kernel's time by op.
    """

    delay: bool = False
    gemv_unroll: int = 0
    gemv_mma_batch: int = 4
    gemv_mma_pipeline: int = 1
    attn_stream: int = 2
    attn_tokens: int = 0
    grid_reduce_parallel: int = 1
    pdl: bool = False
    timeline: bool = False
    load_batch: int = 1

    def __post_init__(self):
        for name, lo, hi in _RANGES:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                from fusionc.errors import CompileError
                raise CompileError(f"CodegenOptions.{name} = {v!r}", op="codegen",
                                   valid=f"an integer from {lo} to {hi}")


def parse_codegen_options(spec: str) -> CodegenOptions:
    """``CodegenOptions`` from ``"name=int,name=int"`` (e.g. ``"gemv_mma_batch=0,load_batch=4"``),
    as the benchmarks' and scripts' ``--codegen`` flags take them.

    Raises:
        CompileError: an unknown name (the valid ones listed), a missing ``=`` or a
            non-integer value, or a value out of range.
    """
    from dataclasses import fields

    from fusionc.errors import CompileError
    names = [f.name for f in fields(CodegenOptions)]
    kw = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, eq, value = item.partition("=")
        if not eq or name.strip() not in names:
            raise CompileError(f"codegen option {item!r}", op="codegen",
                               valid="NAME=INTEGER with NAME one of " + ", ".join(names))
        try:
            kw[name.strip()] = int(value)
        except ValueError:
            raise CompileError(f"codegen option {item!r}: {value!r} is not an integer",
                               op="codegen", valid="NAME=INTEGER") from None
    return CodegenOptions(**kw)


_RANGES = (("gemv_unroll", 0, 32), ("gemv_mma_batch", 0, 1 << 20), ("gemv_mma_pipeline", 0, 2),
           ("attn_stream", 0, 2), ("attn_tokens", 0, 16), ("grid_reduce_parallel", 0, 1),
           ("load_batch", 1, 16))


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
    stamps: list[str] = field(default_factory=list)  # timeline slot labels, in slot order
    resident: bool = False  # the code needs the whole grid resident at once (grid barriers)
    blocks: int = 1  # CTAs per SM the kernel is built for (__launch_bounds__, generate.py)
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

    def stamp(self, label: str) -> str:
        """In a timeline build, the statement that stores the time into a new slot named
        ``label`` (thread 0; callers synchronize the CTA first); else empty."""
        if not self.options.timeline:
            return ""
        self.stamps.append(label)
        return f"FC_STAMP({len(self.stamps) - 1});"

    def render(self, template: str, **kw) -> str:
        return render(template, **kw)
