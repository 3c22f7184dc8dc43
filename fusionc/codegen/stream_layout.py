"""Where a streamed kernel's state goes (:mod:`fusionc.codegen.streamed`): its counter words
(the flushes' split-K counters, the named sets, the exit count, an attention phase's arrival
counters, the error word last), its shared memory (the ring, the flush scratch, the rows'
1/rms, the staged norm weights, an attention phase's units) and its global workspace (the
split-K slots, an attention phase's partial slots)."""
from __future__ import annotations

from fusionc.codegen import attn_phase
from fusionc.ir.kernel import ring_geometry
from fusionc.ir.registry import lookup

CONSUMERS = 256           # consumer threads (8 warps): the thread maps of templates/lib/stream

CHUNK_STRIDE = 32   # words per chunk counter (reset = exit sets): one 128-byte L2 line each,
                    # so the polls of every CTA and the flushes' reds spread over L2 banks


def plan_counters(p) -> None:
    """Counter words: each phase's split-K flush counters (one per group), then the named sets
    (``reset = exit`` sets together, so the last CTA zeroes one run), then, if any, the exit
    count, then the error word."""
    words = 0
    for ph in p.phases:
        ph.flush_base, words = words, words + ph.groups
    sizes, exits = {}, set()
    for ph in p.phases:
        for op in ph.units.regions[0]:
            if lookup(op.name).has("counter"):
                n = op.attr("index") + {"const": 1, "group": ph.groups, "unit": ph.count,
                                        "step": ph.group}[op.attr("slot")]
                sizes[op.attr("name")] = max(sizes.get(op.attr("name"), 0), n)
                if op.name == "counter_wait" and op.attr("reset") == "exit":
                    exits.add(op.attr("name"))
            if op.name == "group_flush" and op.attr("signal"):
                name = op.attr("signal")
                sizes[name] = max(sizes.get(name, 0), -(-ph.groups // op.attr("per")))
    if p.attention is not None and p.attention.attr("wait"):   # waited on by every CTA
        exits.add(p.attention.attr("wait"))
    start = words
    for name in sorted(sizes, key=lambda n: n not in exits):   # exit sets first, together
        stride = CHUNK_STRIDE if name in exits else 1
        p.counters[name] = (words, sizes[name], stride)
        words += sizes[name] * stride
    n_exit = sum(sizes[n] for n in exits)
    if n_exit:
        p.exit_counters = (start, n_exit)
        words += 1   # the exit count
    p.words = attn_phase.plan_counters(p, words) + 1   # the error word last


def plan_smem(p) -> None:
    off = 0
    if p.ring is not None:
        off = ring_geometry(p.ring).total_bytes
    off = -(-off // 16) * 16
    p.scratch_off = off
    off += 16 + (4 * 32 * 4 * p.nb * 4 if p.path == "mma" else 0)
    p.rms_off = off
    if any(op.name == "row_rms" for op in p.kernel.body):
        off += 4 * rms_rows(p) + 4 * (CONSUMERS // 32) * p.max_batch   # fc_rms, its reduction
    p.gamma_off = off = -(-off // 16) * 16
    staged = {}   # one copy per norm weight: sibling phases share theirs
    for ph in p.phases:
        if len(ph.gemv.operands) == 5:
            staged[ph.gemv.operands[3].name] = gamma_elems(p, ph.gemv) * \
                ph.gemv.operands[3].type.dtype.itemsize
    off += sum(staged.values())
    p.smem = attn_phase.plan_smem(p, off)


def rms_rows(p) -> int:
    """Rows of ``fc_rms``: the batch bucket padded to whole mma n-tiles of 8 (zeros past M)."""
    return -(-p.max_batch // 8) * 8


def gamma_elems(p, gemv) -> int:
    """Elements of the norm weight in shared memory: whole K chunks (zeros past K)."""
    return -(-gemv.attr("k") // p.cols) * p.cols


def workspace_floats(p) -> int:
    """Split-K slots: 2 per CTA of the largest grid (the kernel's ``grid``) × max_batch × rows,
    per phase (a CTA's slot of one phase may still be read by a partner while it flushes the
    next); each phase's ``ws_off`` is set here."""
    per = 2 * p.kernel.attr("grid") * p.max_batch * p.rows
    for ph in p.phases:
        ph.ws_off = ph.index * per
    return attn_phase.workspace(p, per * len(p.phases))
