"""Walk a kernel's ops in program order and emit each one's code, with barriers where needed.

Each op becomes a commented block::

    // [op 3, ir 5:3] %p = gemv(%xt, %w) {...} : f32[B, 16]
    { ...block-cooperative code... }

Control ops are emitted here: ``when`` -> ``if`` on the rank or cluster id (uniform per CTA, so
barriers inside are legal), ``exit`` -> ``return``, ``barrier`` -> ``__syncthreads()``,
``cluster_barrier`` -> ``barrier.cluster.arrive.release`` + ``wait.acquire``. Between other ops
a ``__syncthreads()`` is inserted when :class:`~fusionc.codegen.hazards.HazardTracker` says so.
Top-level ops are grouped into named stages, one per span between cluster barriers.
"""
from __future__ import annotations

import os

from fusionc.codegen import emitters
from fusionc.codegen.context import EmitCtx
from fusionc.codegen.hazards import HazardTracker
from fusionc.ir.printer import print_op

INDENT = "  "


def emit_body(ctx: EmitCtx) -> str:
    """The kernel body (after the prologue) as C++ text, indented one level."""
    tracker = HazardTracker()
    lines: list[str] = []
    stage = 0
    ops = ctx.kernel.body
    for k, op in enumerate(ops):
        if k == 0 or ops[k - 1].name == "cluster_barrier":
            stage += 1
            lines += ["", INDENT + f"// ===== stage {stage}: {_stage_name(ops[k:])} ====="]
        lines += _emit_op(op, ctx, tracker, 1)
        lines += _stamp_after(op, ctx)
    return "\n".join(lines)


def _stamp_after(op, ctx: EmitCtx) -> list[str]:
    """A timeline build's time stamp after a top-level op that runs code."""
    if not ctx.options.timeline or op.name in ("smem_alloc", "exit", "grid_barrier") or (
            op.name not in ("when", "barrier", "cluster_barrier") and emitters.get(op).view):
        return []
    res = ", ".join(f"%{r.name}" for r in op.results)
    label = f"op {ctx.index(op)}: " + (f"{res} = " if res else "") + op.name
    return [INDENT + "__syncthreads();  // timeline build", INDENT + ctx.stamp(label)]


def _stage_name(ops) -> str:
    names = []
    for op in ops:
        if op.name == "cluster_barrier":
            names.append("cluster barrier")
            break
        for inner in op.walk():
            if inner.name not in ("smem_alloc", "when", "barrier") and inner.name not in names:
                names.append(inner.name)
    return ", ".join(names) or "empty"


def _where(loc) -> str:
    """``ir LINE:COL`` for IR text, ``FILE.py:LINE`` (base name only, so the source and its
    cache key do not depend on the checkout's path) for DSL locations."""
    if loc is None:
        return ""
    if loc.col is not None and loc.file is None:
        return f", ir {loc.line}:{loc.col}"
    name = os.path.basename(loc.file) if loc.file else "ir"
    return f", {name}:{loc.line}" + (f":{loc.col}" if loc.col is not None else "")


def _comment(op, ctx: EmitCtx, depth: int) -> list[str]:
    text = print_op(op.replace(regions=())) if op.regions else print_op(op)
    return [INDENT * depth + f"// [op {ctx.index(op)}{_where(op.loc)}] {text}"]


def _emit_op(op, ctx: EmitCtx, tracker: HazardTracker, depth: int) -> list[str]:
    pad = INDENT * depth
    lines = _comment(op, ctx, depth)
    if op.name == "when":
        return lines + _emit_when(op, ctx, tracker, depth)
    if op.name == "exit":
        return lines + [pad + "return;"]
    if op.name == "barrier":
        tracker.clear()
        return lines + [pad + "__syncthreads();"]
    if op.name == "cluster_barrier":
        tracker.clear()
        return lines + [pad + ("fc_cluster_sync();" if ctx.cluster > 1 else "__syncthreads();")]
    em = emitters.get(op)
    if em.view:
        return lines + [pad + f"// {ctx.ref(op.result).ptr} is a view of "
                        f"{ctx.ref(op.operands[0]).ptr} (no code)"]
    code = em.emit(op, ctx)
    if code.startswith("//") and "\n" not in code:  # nothing runs (smem_alloc)
        return lines + [pad + code]
    reads, writes = _effects(op, ctx, em)
    if tracker.needs_barrier(reads, writes):
        lines.append(pad + "__syncthreads();  // earlier ops' shared data")
        tracker.clear()
    tracker.record(reads, writes)
    lines.append(pad + "{")
    lines += [(pad + INDENT + ln) if ln else "" for ln in code.splitlines()]
    lines.append(pad + "}")
    return lines


def _effects(op, ctx: EmitCtx, em) -> tuple[list, list]:
    writes = [ctx.ref(op.operands[i]).region for i in em.writes_operands]
    reads = [ctx.ref(v).region for i, v in enumerate(op.operands)
             if i not in em.writes_operands]
    writes += [ctx.ref(r).region for r in op.results]
    scratch = ctx.plan.scratch.get(ctx.index(op))
    if scratch:
        writes.append(("smem", scratch[0], scratch[0] + scratch[1]))
    return reads, writes


def _emit_when(op, ctx: EmitCtx, tracker: HazardTracker, depth: int) -> list[str]:
    pad = INDENT * depth
    var = "fc_rank" if op.attr("on") == "rank" else "fc_cluster"
    lo, hi = op.attr("lo"), op.attr("hi")
    cond = f"{var} >= {lo} && {var} < {hi}" if lo else f"{var} < {hi}"
    lines = [pad + f"if ({cond}) {{  // uniform per CTA"]
    inner = tracker.copy()
    for sub in op.regions[0]:
        lines += _emit_op(sub, ctx, inner, depth + 1)
    lines.append(pad + "}")
    tracker.merge(inner)
    return lines
