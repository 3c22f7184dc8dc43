"""Code generation of streamed persistent kernels (design v2): a kernel whose body is
``acc_alloc`` / ``ring_alloc`` ops and one ``units`` region.

Execution model of the generated kernel (``templates/streamed.cu.j2``):
- a persistent grid: ``gridDim.x`` CTAs (the runtime launches ``min(resident CTAs, units)``,
  :class:`fusionc.stream.UnitSchedule`), each running units ``[fc_u0, fc_u1)``;
- 8 consumer warps (256 threads) and, when the region has producer ops, one producer warp
  (threads 256..287) that runs ``ring_claim`` / ``ring_issue`` for every unit ahead of the
  consumers, throttled only by the ring's empty barriers; the consumers synchronize among
  themselves with named barrier 1 (the producer never joins a CTA-wide barrier after setup);
- shared memory: the ring's stages, its 2·S mbarriers, then the flush scratch (a flag and the
  tensor-core path's K-half exchange); accumulators live in registers;
- programmatic dependent launch: launched with programmatic stream serialization, the kernel
  lets its successor launch at once (its CTAs start on the SMs this one's CTAs leave) and
  streams its first stages' weights before ``griddepcontrol.wait``; activations, outputs,
  workspace and counters are touched only after it;
- extra arguments: the split-K workspace (2 slots per CTA of ``max_batch × rows`` floats) and
  the counters (one per group for the flushes, then the named counter sets, then an error word).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import fusionc
from fusionc.codegen import attn_phase, cnames, libs
from fusionc.codegen.attn_units import attn_op
from fusionc.codegen.stream_layout import CONSUMERS, plan_counters, plan_smem, workspace_floats
from fusionc.codegen.context import CodegenOptions
from fusionc.codegen.render import render
from fusionc.codegen.source import KernelParam, KernelSource
from fusionc.errors import CompileError
from fusionc.ir.kernel import ring_geometry
from fusionc.ir.nodes import Graph, Op
from fusionc.ir.ops.tile_units import in_producer, phases_of, units_op
from fusionc.ir.printer import print_graph
from fusionc.ir.types import DType
from fusionc.lower.linear_v2 import ROWS, WIDE_ROWS
from fusionc.stream.ring import matrix_lead

TILE_ROWS = (ROWS, WIDE_ROWS)   # weight rows per tile the generator takes

# The tensor-core path issues wgmma (a warpgroup's m64nNk16 from shared memory) at every batch:
# faster than mma.sync + ldmatrix per warp from 1 row (H200 2026-12-03, same run: the Llama-2-7B
# / Llama-3-8B MLPs 2.4-3.2 us at 1-8 rows, every GEMV at 1 and 16 rows). FUSIONC_MMA=sync
# keeps mma.sync for A/B runs, up to SYNC_MAX_ROWS (past them its fragments spill).
SYNC_MAX_ROWS = 64
TOP_LEVEL = ("acc_alloc", "ring_alloc", "row_rms", "attn_units", "units")
COUNTER_TIMEOUT_NS = 2_000_000_000



@dataclass
class Phase:
    """One ``units`` region of a streamed kernel and where its flushes keep their state."""

    units: Op
    gemv: Op
    index: int = 0
    flush_base: int = 0          # first counter word of its groups' split-K flushes
    ws_off: int = 0              # first workspace float of its split-K slots
    producer_setup: str = ""     # the producer's code before the phase's unit loop
    producer_body: str = ""
    consumer_body: str = ""
    before: str = ""             # the consumers' code before the phase (an attention phase)
    producer_done: str = ""      # timeline stamps after the phase (stream_timeline)
    consumer_done: str = ""

    @property
    def count(self) -> int:
        return self.units.attr("count")

    @property
    def group(self) -> int:
        return self.units.attr("group")

    @property
    def groups(self) -> int:
        return -(-self.count // self.group)

    @property
    def split(self) -> int:
        return self.gemv.attr("split")


@dataclass
class StreamPlan:
    """Compile-time choices of one streamed kernel, shared by its op emitters."""

    kernel: Graph
    phases: list
    ring: Op | None
    path: str                    # "mma", "fma" (smem) or "plain" (global loads)
    rows: int
    cols: int
    max_batch: int
    counters: dict = field(default_factory=dict)   # name -> (first word, slots, stride)
    words: int = 0               # counter words in all (the exit word, then the error word last)
    exit_counters: tuple = ()    # (first word, slots) of the reset = exit sets (CHUNK_STRIDE)
    smem: int = 0
    scratch_off: int = 0
    rms_off: int = 0             # row_rms: max_batch floats, then 8 x max_batch (reduction)
    gamma_off: int = 0           # acc_gemv's norm weight, whole K chunks
    wgmma: bool = False          # the tensor-core path on wgmma (else mma.sync: FUSIONC_MMA)
    attention: Op | None = None  # an attention phase's attn_units (fusionc.codegen.attn_phase)
    att_counters: int = 0        # its arrival counters, shared memory, partial slots
    att_smem: int = 0
    att_ws: int = 0

    @property
    def count(self) -> int:
        """Units of the largest phase: the most CTAs the kernel can use."""
        return max(ph.count for ph in self.phases)

    @property
    def producer(self) -> bool:
        return any(in_producer(op) for ph in self.phases for op in ph.units.regions[0])

    @property
    def threads(self) -> int:
        return CONSUMERS + (32 if self.producer else 0)

    @property
    def nb(self) -> int:
        return -(-self.max_batch // 8)



def is_streamed(kernel: Graph) -> bool:
    """Whether ``kernel`` is a streamed persistent kernel (it has a ``units`` region)."""
    return units_op(kernel) is not None


def plan(kernel: Graph, check: bool = True) -> StreamPlan:
    """The plan of a streamed kernel; CompileError for what the generator cannot emit yet
    (``check``: and for a ring program without the protocol's waits)."""
    for op in kernel.body:
        if op.name not in TOP_LEVEL:
            raise CompileError("op outside the units region of a streamed kernel",
                               op=op.name, loc=op.loc, valid=", ".join(TOP_LEVEL))
    ring = next((op for op in kernel.body if op.name == "ring_alloc"), None)
    phases = [Phase(u, _one_gemv(u), i) for i, u in enumerate(phases_of(kernel))]
    g = phases[0].gemv
    rows, cols = g.attr("rows"), g.attr("cols")
    dt = g.operands[1].type.dtype
    v = 16 // dt.itemsize
    for ph in phases:
        if (ph.gemv.attr("rows"), ph.gemv.attr("cols")) != (rows, 16 * v) or rows not in \
                TILE_ROWS or ph.gemv.operands[1].type.dtype != dt:
            raise CompileError(f"tiles of {ph.gemv.attr('rows')} x {ph.gemv.attr('cols')}",
                               op=ph.gemv.name, loc=ph.gemv.loc,
                               valid=f"64 (or, on tensor cores, 128) rows x {16 * v} columns "
                                     f"(256-byte row chunks) of {dt.value}, the same in every "
                                     "phase")
    mb = kernel.attr("max_batch")
    on_ring = ring is not None and all(_from_ring(ph.units, ph.gemv) for ph in phases)
    if len(phases) > 1 and not on_ring:
        raise CompileError("phases on the plain-load path", op="units", loc=phases[1].units.loc,
                           valid="several phases only when every tile comes through the ring "
                                 "(stream-plan, insert-barriers and smem-plan after "
                                 "partition-units, as v2_pipeline runs them)")
    path = "plain" if not on_ring else (
        "mma" if dt in (DType.f16, DType.bf16) else "fma")   # mma from 1 row (n-tile of 8)
    from fusionc.lower.linear_v2 import max_rows
    top = min(max_rows(dt, ph.gemv.attr("k")) for ph in phases)
    if mb > top:
        raise CompileError(f"max_batch {mb} in a streamed linear of {dt.value}", op=g.name,
                           loc=g.loc, valid=f"max_batch <= {top} (batch rows in registers)")
    if ring is not None and check:
        for ph in phases:
            _check_protocol(ph.units, ring)
    p = StreamPlan(kernel, phases, ring, path, rows, cols, mb,
                   wgmma=path == "mma" and _mma_choice(g, mb, rows, path) == "wgmma",
                   attention=attn_op(kernel))
    if kernel.attr("threads") != p.threads:
        raise CompileError(f"{kernel.attr('threads')} threads", op=kernel.name, loc=kernel.loc,
                           valid=f"{p.threads}: {CONSUMERS} consumer threads" +
                                 (" and a producer warp" if p.producer else ""))
    plan_counters(p)
    plan_smem(p)
    return p


def _one_gemv(units: Op) -> Op:
    body = units.regions[0]
    gemvs = [op for op in body if op.name == "acc_gemv"]
    if len(gemvs) != 1:
        raise CompileError(f"{len(gemvs)} acc_gemv ops in the units region", op="units",
                           loc=units.loc, valid="one acc_gemv per units region")
    if sum(op.name == "group_flush" for op in body) != 1:
        raise CompileError("a streamed linear without one group_flush", op="units",
                           loc=units.loc, valid="one group_flush (else y is never written)")
    return gemvs[0]


def _check_protocol(units: Op, ring: Op) -> None:
    """CompileError unless the region follows the ring protocol the kernel implements (pass
    ``insert-barriers`` adds it): ``ring_claim`` right before ``ring_issue``, ``ring_wait``
    before the first read of a stage view, ``ring_release`` after the last, and an issue for
    the ring (else the consumers wait forever)."""
    body = list(units.regions[0])
    names = [op.name for op in body]
    want = "claim, issue, stage, wait, reads, release (pass insert-barriers)"
    if "ring_issue" not in names:
        raise CompileError("a ring that nothing fills", op="ring_alloc", loc=ring.loc,
                           valid="ring_issue in the units region")
    i = names.index("ring_issue")
    if i == 0 or names[i - 1] != "ring_claim":
        raise CompileError("ring_issue not right after a ring_claim", op="ring_issue",
                           loc=body[i].loc, valid=want)
    views = {r.name for op in body if op.name == "ring_stage" for r in op.results}
    reads = [k for k, op in enumerate(body) if any(v.name in views for v in op.operands)]
    waits = [k for k, n in enumerate(names) if n == "ring_wait"]
    rel = [k for k, n in enumerate(names) if n == "ring_release"]
    if reads and (not waits or waits[0] > reads[0]):
        raise CompileError("a stage read before ring_wait", op=body[reads[0]].name,
                           loc=body[reads[0]].loc, valid=want)
    if reads and (not rel or rel[-1] < reads[-1]):
        raise CompileError("a stage read with no ring_release after it",
                           op=body[reads[-1]].name, loc=body[reads[-1]].loc, valid=want)
    for k, op in enumerate(body):   # a producer's acquire, then the TMA reads of that data
        if op.name == "counter_wait" and in_producer(op) and k < i and \
                "fence_proxy_async" not in names[k + 1:i]:
            raise CompileError("a producer counter_wait with no fence_proxy_async before "
                               "ring_issue", op=op.name, loc=op.loc,
                               valid="counter_wait, fence_proxy_async, ring_claim, ring_issue "
                                     "(pass insert-barriers)")


def _from_ring(units: Op, gemv: Op) -> bool:
    stage_vals = {r.name for op in units.regions[0] if op.name == "ring_stage" for r in op.results}
    return gemv.operands[2].name in stage_vals


def _mma_choice(g: Op, max_batch: int, rows: int, path: str) -> str:
    """The tensor-core path's instructions, ``"wgmma"`` or ``"sync"`` (``$FUSIONC_MMA``);
    CompileError for wide tiles off the wgmma path or an override the path cannot follow."""
    forced = os.environ.get("FUSIONC_MMA", "")
    if rows == WIDE_ROWS and (path != "mma" or forced == "sync"):
        raise CompileError(f"tiles of 128 rows on the {'mma.sync' if path == 'mma' else path} "
                           "path", op=g.name, loc=g.loc,
                           valid="64-row tiles, or 128 with wgmma (16-bit rows TMA copies)")
    if forced not in ("", "sync", "wgmma"):
        raise CompileError(f"FUSIONC_MMA={forced!r}", op=g.name, loc=g.loc,
                           valid="unset, 'sync' (mma.sync + ldmatrix) or 'wgmma'")
    if forced == "sync" and max_batch > SYNC_MAX_ROWS:
        raise CompileError(f"FUSIONC_MMA=sync at max_batch {max_batch}", op=g.name, loc=g.loc,
                           valid=f"max_batch <= {SYNC_MAX_ROWS} (mma.sync's fragments spill "
                                 "past it), or FUSIONC_MMA unset / 'wgmma'")
    return forced or "wgmma"


def generate_streamed(kernel: Graph, options: CodegenOptions | None = None) -> KernelSource:
    """The CUDA source of a streamed kernel (see the module docstring); a timeline build
    (``options.timeline``, :mod:`fusionc.codegen.stream_timeline`) is emitted twice, the first
    time to count its stamp points.

    Raises:
        CompileError: ops or tile shapes the generator does not support.
    """
    from fusionc.codegen.stream_timeline import Stamps
    options = options or CodegenOptions()
    n = len(_generate(kernel, Stamps(on=True)).stamps) if options.timeline else 0
    return _generate(kernel, Stamps(on=bool(n)), n)


def _generate(kernel: Graph, stamps, n: int = 0) -> KernelSource:
    from fusionc.codegen import ops_stream
    from fusionc.codegen.stream_timeline import reserve
    p = plan(kernel)
    stamps.base = reserve(p, n)
    ws = workspace_floats(p)
    params = _params(kernel, p)
    refs = {kp.value.name: kp.name for kp in params if kp.kind == "tensor"}
    ctx = ops_stream.StreamCtx(p, refs, stamps=stamps)
    entry = stamps.at("entry", "cta")
    for op in p.kernel.body:
        if op.name == "row_rms":
            ctx.consumer_setup += ops_stream.row_rms(op, ctx)
    attn_phase.setup(p, ctx)
    for ph in p.phases:
        ctx.phase = ph
        prod, cons = [], []
        for op in ph.units.regions[0]:
            code = ops_stream.emit(op, ctx)
            (prod if in_producer(op) else cons).append(_block(op, code))
        ph.producer_body, ph.consumer_body = "\n".join(prod), "\n".join(cons)
        if p.producer:   # before phase 0's PDL wait: when the first weights were issued
            first = stamps.at(f"producer: phase {ph.index}'s first weights issued", "producer")
            pdl = "fc_grid_dependency_wait();"
            ph.producer_setup = ph.producer_setup.replace(pdl, first + pdl, 1) \
                if pdl in ph.producer_setup else ph.producer_setup + first
            ph.producer_done = stamps.at(f"producer: phase {ph.index}'s copies issued",
                                         "producer")
        ph.consumer_done = stamps.at(f"consumers: phase {ph.index} done", "consumer")
    name = cnames.ident("fusionc", kernel.name)
    ring = ring_geometry(p.ring) if p.ring is not None else None
    exit_p, exit_c = ops_stream.exit_code(ctx)
    source = render(
        "streamed.cu.j2", version=fusionc.__version__, kernel_name=f"kernel @{kernel.name}",
        ir_lines=print_graph(kernel).splitlines(),
        libs=libs.render_libs({"mma", "stream", "wgmma", "stream_flush"} |
                              ({"attention"} if p.attention is not None else set())),
        defs="\n".join(d for d in (ctx.defs, stamps.macro(kernel.attr("grid"))) if d),
        entry=entry,
        name=name, params=[kp.decl for kp in params], threads=p.threads, smem=p.smem,
        count=p.count, phases=p.phases, ring=ring, producer=p.producer,
        producer_setup=ctx.producer_setup, consumer_setup=ctx.consumer_setup,
        scratch_off=p.scratch_off, consumers=CONSUMERS, epilogue="\n".join(ctx.epilogues),
        exit_code=exit_c, producer_exit=exit_p,
        stage_decls=ops_stream.stage_decls(ctx) if p.ring is not None else "") + "\n"
    return KernelSource(name=name, source=source, kernel=kernel, grid=kernel.attr("grid"),
                        cluster=1, threads=p.threads, smem_bytes=p.smem, params=tuple(params),
                        workspace_floats=ws, counters=p.words, resident=bool(p.exit_counters),
                        persistent_units=p.count if p.attention is None else
                        p.attention.attr("grid"), pdl=True, stamps=tuple(stamps.labels),
                        stamp_base=stamps.base)


def _block(op: Op, code: str) -> str:
    from fusionc.ir.printer import print_op
    lines = [f"// {print_op(op)}", "{"] + ["  " + ln if ln else "" for ln in code.splitlines()]
    return "\n".join(lines + ["}"])


def tensor_params(kernel: Graph) -> list[KernelParam]:
    """One pointer argument per kernel parameter, const unless the kernel returns it."""
    outputs = {v.name for v in kernel.outputs}
    out = []
    for v in kernel.params:
        const = "" if v.name in outputs else "const "
        ptr = cnames.ident("p", v.name)
        out.append(KernelParam(ptr, "tensor",
                               f"{const}{cnames.ctype(v.type.dtype)}* __restrict__ {ptr}",
                               value=v))
    return out


def tail_params(kernel: Graph) -> list[KernelParam]:
    """The symbolic dims, then the global workspace and the counters."""
    from fusionc.codegen.generate import symbols
    out = [KernelParam(cnames.dim_name(s), "dim", f"const int {cnames.dim_name(s)}", symbol=s)
           for s in symbols(kernel)]
    out.append(KernelParam("fc_ws", "workspace", "float* __restrict__ fc_ws"))
    out.append(KernelParam("fc_counters", "counters", "unsigned* __restrict__ fc_counters"))
    return out


def _params(kernel: Graph, p: StreamPlan) -> list[KernelParam]:
    out = tensor_params(kernel)
    from fusionc.codegen.ops_stream import tmap
    issues = [op for ph in p.phases for op in ph.units.regions[0] if op.name == "ring_issue"]
    geo = ring_geometry(p.ring) if p.ring is not None else None
    for op in issues:
        wbox = geo.rows // 2 if op.attr("split") else geo.rows
        for v, rows, role in ((op.operands[1], wbox, "w"),
                              (op.operands[2], geo.xbox_rows, "x")):
            if any(kp.name == tmap(v) for kp in out):
                continue
            out.append(KernelParam(tmap(v), "tensormap",
                                   f"const __grid_constant__ FcTensorMap {tmap(v)}", value=v,
                                   box=(geo.box_cols, rows),
                                   lead=matrix_lead(v.type.rank, role)))
    return out + tail_params(kernel)
