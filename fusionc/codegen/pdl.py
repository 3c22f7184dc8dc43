"""Programmatic dependent launch (PDL) prologue of a kernel (CUDA Programming Guide,
"Programmatic Dependent Launch and Synchronization"; PTX ISA, ``griddepcontrol``).

A kernel launched with the programmatic-stream-serialization attribute may start while the
previous kernel of the stream is still running. Each generated kernel therefore (1) prefetches
the first rows of its first weight tile into L2 — weights are never written by any kernel, so
reading them early is safe —, (2) waits until the previous kernel has completed and its writes
are visible (``griddepcontrol.wait``) before it touches anything else, and (3) lets its own
successor start once its weight stream is done: before its first ``grid_reduce`` (the
cross-CTA tail) or at its end (``griddepcontrol.launch_dependents``). Triggering at the start
instead was measured 20% slower on whole decode steps (the waiting successor CTAs take SMs from
the predecessor's later waves; BENCHMARKS.md). Without the attribute the instructions are
no-ops, so a PDL kernel is correct in any launch.
"""
from __future__ import annotations

from fusionc.codegen import cnames

PREFETCH_BYTES = 32 * 1024   # per CTA: the next kernel's first weight rows while this one drains
LINE = 128                   # bytes per prefetch (L2 line)


def prologue(ctx) -> str:
    """The CUDA lines of the PDL prologue for the kernel of ``ctx`` (empty without PDL)."""
    if not ctx.options.pdl:
        return ""
    lines = ["// PDL: prefetch weights, then wait for the predecessor"]
    lines += _prefetch(ctx)
    lines.append('asm volatile("griddepcontrol.wait;" ::: "memory");')
    return "\n  ".join(lines)


TRIGGER = 'asm volatile("griddepcontrol.launch_dependents;");  // PDL: successor may start'


def trigger(ctx) -> str:
    """The successor trigger, or empty without PDL."""
    return TRIGGER if ctx.options.pdl else ""


def _prefetch(ctx) -> list[str]:
    """L2 prefetch of up to PREFETCH_BYTES of the first top-level gemv's weight rows."""
    params = {p.name for p in ctx.kernel.params}
    op = next((o for o in ctx.kernel.body if o.name == "gemv"
               and o.operands[1].name in params), None)
    if op is None:
        return []
    x, w = ctx.ref(op.operands[0]), ctx.ref(op.operands[1])
    k, n_w, ldw = x.shape[-1], w.shape[0], w.shape[1]
    if not all(isinstance(v, int) for v in (k, n_w, ldw)):
        return []
    row_bytes = k * w.itemsize
    per_row = -(-row_bytes // LINE)
    rows = max(1, min(op.attr("rows"), PREFETCH_BYTES // max(row_bytes, 1)))
    return [
        "{",
        f"  const long long fc_r0 = {cnames.affine(op.attr('row'))}, "
        f"fc_c0 = {cnames.affine(op.attr('col'))};",
        f"  for (int i = threadIdx.x; i < {rows * per_row}; i += FC_THREADS) {{",
        f"    const long long r = fc_r0 + i / {per_row};",
        f"    const long long c = fc_c0 + (long long)(i % {per_row}) * {LINE // w.itemsize};",
        f"    if (r >= 0 && r < {n_w} && c >= 0 && c < {ldw})",
        f'      asm volatile("prefetch.global.L2 [%0];" :: "l"({w.ptr} + r * {ldw}LL + c));',
        "  }",
        "}",
    ]
