"""Design v2 lowering of a linear layer ``y = x·Wᵀ (+ bias)`` to a streamed persistent kernel.

Work decomposition (:class:`fusionc.stream.UnitSchedule`): the weight ``[N, K]`` is cut into
tiles of ``ROWS`` rows × ``cols`` columns (a 256-byte row chunk: 128 f16/bf16 or 64 f32
elements); unit ``u = g·kt + s`` is tile (row block ``g``, K chunk ``s``), ``kt = ⌈K / cols⌉``
units per group. A persistent grid of every resident CTA (at most the units) takes balanced
contiguous unit ranges, so every SM streams the same number of tiles whatever N and K are
(split-K over CTAs where a row block straddles two ranges, summed in a fixed order).

This module builds the first, plain form (``acc_gemv`` reading the global tiles); the passes
``stream-plan``, ``insert-barriers`` and ``smem-plan`` (:mod:`fusionc.passes.stream`) put the
tiles on a TMA-fed ring, add its waits and size it.
"""
from __future__ import annotations

from fusionc.cost.h200 import H200
from fusionc.errors import LoweringError
from fusionc.ir.nodes import Graph, Op, Value
from fusionc.ir.types import FLOAT_DTYPES, TensorType, DType
from fusionc.lower.builder import KernelBuilder
from fusionc.stream.ring import tma_rows

ROWS = 64            # weight rows per tile (the tensor-core path's 4 strips of 16)
WIDE_ROWS = 128      # the tensor-core path's wide tiles: one warpgroup per 64 rows, whole chunks
ROW_CHUNK_BYTES = 256  # K chunk per tile row: 16 lanes x 16 bytes
# Batch rows held in registers per path (issue 21 takes them to 256). The tensor-core path
# holds 4 floats per 8 batch rows (an mma n-tile) per thread: 128 rows compile without spills on
# wgmma (166-168 registers; 194 KB of shared memory for the Llama MLPs, 225 KB for a lone
# 4096 x 4096 linear: the activation box of every stage grows with the batch, so 256 rows do
# not fit). The FMA paths (f32, and rows TMA cannot copy) hold 4 floats per batch row: 32 rows
# spill.
MAX_BATCH_MMA = 128
MAX_BATCH_FMA = 16


def max_rows(dtype: DType, k) -> int:
    """The largest batch bucket of a v2 linear of ``dtype`` over ``K = k`` columns: tensor
    cores for 16-bit types whose rows TMA copies, FMA otherwise. The lowering, the code
    generator and :func:`fused_rows` all ask this."""
    return MAX_BATCH_MMA if dtype.itemsize == 2 and tma_rows(k, 2) else MAX_BATCH_FMA


def fused_rows(g: Graph) -> int | None:
    """The largest batch bucket every linear of graph ``g`` takes on lowering v2 (None: no
    linear); above it ``fusionc.compile`` takes the library path (also below it, where
    ``fusionc.cost.h200.Device.v2_path`` says so)."""
    tops = [max_rows(op.operands[0].type.dtype, op.operands[1].type.shape[-1])
            for op in g.body if op.name in ("linear", "head_linear")]
    return min(tops) if tops else None


def tile_cols(dtype: DType) -> int:
    """Elements of one tile row (a 256-byte K chunk)."""
    return ROW_CHUNK_BYTES // dtype.itemsize


def check_linear(op: Op, max_batch: int) -> None:
    """LoweringError unless ``op`` is a linear layer the v2 kernel lowers: x ``[B, K]``, a static
    weight ``[N, K]`` of a float dtype, and a batch bucket of at most :func:`max_rows` rows
    (a ``head_linear``: x ``[B, H, K]`` and weight ``[H, N, K]``)."""
    x, w = op.operands[0].type, op.operands[1].type
    if x.rank != (3 if op.name == "head_linear" else 2):
        raise LoweringError(f"linear on x {x}", op=op.name, loc=op.loc,
                            valid="x of shape [B, K] (reshape to rows first)")
    if not w.is_static or x.dtype not in FLOAT_DTYPES:
        raise LoweringError(f"weight {w}", op=op.name, loc=op.loc,
                            valid="a static [N, K] weight of f16, bf16 or f32")
    top = max_rows(x.dtype, w.shape[-1])
    if isinstance(x.shape[0], int) and x.shape[0] > top or max_batch > top:
        path = "tensor-core" if top == MAX_BATCH_MMA else "FMA"
        raise LoweringError(f"{max(max_batch, x.shape[0] if isinstance(x.shape[0], int) else 0)}"
                            f" rows of {x.dtype.value}", op=op.name, loc=op.loc,
                            valid=f"at most {top} rows per fused kernel on the {path} path "
                                  f"(max_batch <= {top}); above it fusionc.compile's default "
                                  "pipeline takes the library path (given a pipeline: "
                                  "fusionc.runtime.pipelines.library_pipeline(graph))")


def lower_linear(op: Op, name: str, max_batch: int, grid: int | None = None,
                 spec=None, rows: int = ROWS) -> Graph:
    """The plain streamed kernel of linear ``op`` (``acc_gemv`` on global tiles).

    Args:
        op: a graph-IR ``linear`` with x ``[B, K]``, w ``[N, K]`` and an optional bias ``[N]``.
        name: the kernel's name.
        max_batch: the batch bucket (rows of the accumulators, <= :func:`max_rows`).
        grid: the largest grid the kernel is launched on (workspace slots); default one CTA
            per SM of an H200. The runtime launches min(resident CTAs, units, grid).
        spec: what the kernel absorbs (:class:`fusionc.lower.match_v2.LinearKernel`): an
            RMSNorm prologue, paired gate/up tiles, epilogue steps; default none.
        rows: weight rows per tile: ``ROWS`` (64), or ``WIDE_ROWS`` (128, tensor cores only:
            each activation box serves twice the weight rows, half the L2 reads per weight byte).
    Raises:
        LoweringError: shapes the v2 linear does not take (:func:`check_linear`), or wide tiles
            on the FMA paths.
    """
    from fusionc.lower.match_v2 import LinearKernel
    return lower_chain([spec or LinearKernel(op, out=op.result)], name, max_batch, grid, rows)


def lower_chain(specs: list, name: str, max_batch: int, grid: int | None = None,
                rows: int = ROWS, attention=None) -> Graph:
    """One streamed kernel of a chain of linears (:func:`fusionc.lower.match_v2.chains`): a
    ``units`` region (phase) per linear, in order; phase ``p + 1`` reads phase ``p``'s output
    in K chunks whose producer groups' flushes signal a counter per chunk (``group_flush
    {signal, per}``), which its producer waits on (``counter_wait {slot = step, reset = exit}``)
    before the chunk's activation boxes; its weight boxes need no wait. A block-diagonal
    phase (``head_linear``: ``acc_gemv {head_rows, head_cols}``) whose heads are no multiple of
    ``rows`` makes the kernel take 64-row tiles. A sibling phase
    (:func:`fusionc.lower.match_v2.sibling`) reads the first phase's x through its prologue,
    with no wait. ``attention``: an attention core (:class:`fusionc.lower.attention_v2.
    AttentionCore`) whose ``o_flat`` the last linear of ``specs`` reads (the output
    projection), its ``qkv`` the linear before it if any (the QKV projection): its
    ``attn_units`` op runs between them as the kernel's attention phase, on the consumer
    warps, after every group flush of the QKV phase (``group_flush {signal = qkv}``,
    ``attn_units {wait = qkv}``), each CTA then signalling counter ``attn`` once; the
    projection's producer streams its first weight stages meanwhile and waits for every CTA's
    signal (``counter_wait {scale = grid}``) before its activation boxes. Arguments as
    :func:`lower_linear`; LoweringError as :func:`check_linear`."""
    ops = [s.linear for s in specs]
    if any(s.head_rows % rows for s in specs):
        rows = ROWS   # a head of 64 rows: 64-row tiles stay inside one head
    for op in ops:
        x = op.operands[0]
        if isinstance(x.type.shape[0], int):   # a static batch sizes the kernel itself
            max_batch = max(max_batch, x.type.shape[0])
    for op in ops:
        check_linear(op, max_batch)
        _check_rows(op, rows)
    b = KernelBuilder(name, ops[0].loc)
    first = specs[0]
    norm, px = (), None
    grid = grid or H200.sms
    if attention is None:   # the attention units use every CTA; a CTA without units idles
        grid = min(max(_geometry(s, rows)[0] for s in specs), grid)
    at = len(specs) - 1 if attention is not None else -1   # the phase after the attention
    if at != 0 and first.norm is not None:
        x0, gamma = first.norm.operands[0], first.norm.operands[1]
        px, pg = b.param(x0), b.param(gamma)
        norm = (pg, b.op("row_rms", px, eps=first.norm.attr("eps"), hint="rms",
                         loc=first.norm.loc))
    elif at != 0:
        px = b.param(first.xin)
    acc = b.op("acc_alloc", types=[TensorType(DType.f32, (ops[0].operands[0].type.shape[0],
                                                           rows))], hint="acc")
    x0, norm0 = px, norm
    reads = [i > 0 and specs[i].xin.name == specs[i - 1].out.name for i in range(len(specs))]
    for i, spec in enumerate(specs):   # a phase reads the previous one's output, or x0
        if i == at:
            from fusionc.lower.attention_v2 import emit_units
            groups = _groups(specs[i - 1], rows) if i else 0
            o = emit_units(b, attention, grid, signal=ATTENTION_SIGNAL,
                           wait=QKV_SIGNAL if i else "", wait_target=groups)
        nxt = specs[i + 1] if i + 1 < len(specs) and reads[i + 1] else None
        prev = specs[i - 1] if reads[i] else None
        x, nrm = (o, ()) if i == at else (px if prev else x0, () if prev else norm0)
        px, _ = _phase(b, spec, acc, x, nrm, i, nxt, prev, rows, after_attention=i == at,
                       signal_all=QKV_SIGNAL if i == at - 1 else "")
    return b.build(grid=grid, cluster=1, threads=256, max_batch=max_batch)


def _groups(spec, rows: int) -> int:
    """Output groups (row blocks) of one linear's phase."""
    count, kt, _ = _geometry(spec, rows)
    return -(-count // kt)


ATTENTION_SIGNAL = "attn"   # the counter an attention phase's CTAs signal (lower_chain)
QKV_SIGNAL = "qkv"          # the counter a QKV phase's flushes signal for an attention phase


def _check_rows(op: Op, rows: int) -> None:
    w = op.operands[1].type
    if rows == ROWS or rows == WIDE_ROWS and max_rows(w.dtype, w.shape[-1]) == MAX_BATCH_MMA:
        return
    raise LoweringError(f"tiles of {rows} weight rows", op=op.name, loc=op.loc,
                        valid=f"{ROWS}, or {WIDE_ROWS} on the tensor-core path (f16 / bf16 rows "
                              "TMA copies)")


def _geometry(spec, rows: int) -> tuple[int, int, int]:
    """(units, units per group, output columns per group) of one linear's phase."""
    n, k = spec.nk
    kt = -(-k // tile_cols(spec.linear.operands[1].type.dtype))
    half = rows // 2 if spec.split else rows
    return -(-(spec.split or n) // half) * kt, kt, half


def _phase(b: KernelBuilder, spec, acc: Value, px: Value, norm: tuple, i: int, nxt, prev,
           rows: int, after_attention: bool = False, signal_all: str = ""):
    """Emit the units region of one linear; returns (its output, its units). ``signal_all``:
    every group flush signals that counter's one slot (an attention phase waits on them)."""
    op = spec.linear
    w = op.operands[1]
    bias = op.operands[2] if len(op.operands) == 3 else None
    n, k = spec.nk
    cols = tile_cols(w.type.dtype)
    count, kt, half = _geometry(spec, rows)
    pw = b.param(w)
    steps, extras = [], []
    if bias is not None:
        steps.append("bias")
        extras.append(b.param(bias))
    for st, t in spec.steps:
        steps.append(st)
        if t is not None:
            extras.append(b.param(t))
    py = b.output(spec.out, pure=True)
    signal = {}
    if nxt is not None:   # the next phase reads py in K chunks of `per` groups' columns
        per = tile_cols(nxt.linear.operands[1].type.dtype) // half
        signal = {"signal": f"ready{i}", "per": per}
    if signal_all:
        signal = {"signal": signal_all, "per": -(-count // kt)}
    with _units(b, count, kt):
        if after_attention:   # x is o_flat: every CTA's attention units are done
            _attr_op(b, "counter_wait", op.loc, name=ATTENTION_SIGNAL, slot="const", target=1,
                     scale="grid", reset="exit", warp="producer")
        if prev is not None:
            pcount, pkt, phalf = _geometry(prev, rows)
            _attr_op(b, "counter_wait", op.loc, name=f"ready{i - 1}", slot="step",
                     target=cols // phalf, total=-(-pcount // pkt), reset="exit",
                     warp="producer")
        b.op("acc_gemv", acc, px, pw, *norm, rows=rows, cols=cols, n=n, k=k, split=spec.split,
             head_rows=spec.head_rows, head_cols=spec.head_cols, loc=op.loc)
        b.op("group_flush", acc, py, *extras, rows=rows, epilogue=",".join(steps), loc=op.loc,
             **signal)
    return py, count


def _attr_op(b: KernelBuilder, op_name: str, loc, **attrs) -> None:
    """Append an op without operands or results (its attributes may include ``name``)."""
    from fusionc.ir.registry import lookup
    b._ops[-1].append(Op(op_name, (), (), lookup(op_name).make_attrs(attrs, loc), (), loc))


class _units:
    """``with _units(builder, count, group):`` emits a ``units`` region around the ops."""

    def __init__(self, b: KernelBuilder, count: int, group: int):
        self.b, self.count, self.group = b, count, group

    def __enter__(self):
        self.b._ops.append([])

    def __exit__(self, *exc):
        from fusionc.ir.registry import lookup
        body = self.b._ops.pop()
        attrs = lookup("units").make_attrs({"count": self.count, "group": self.group})
        self.b._ops[-1].append(Op("units", (), (), attrs, (tuple(body),), self.b.loc))
        return False


__all__ = ["lower_linear", "lower_chain", "check_linear", "tile_cols", "max_rows", "fused_rows",
           "Value"]
