"""An attention phase in a streamed kernel (``partition-units{attention_o}``): the
``attn_units`` op at the top level, before the units regions, run by the consumer warps
(:func:`fusionc.codegen.attn_units.phase_code`), after the QKV phase's flushes if the kernel
has one, while the producer warp streams the next phase's first weight stages; the next
phase's producer waits for one signal per CTA.

Where its state goes, after the streamed kernel's own (:mod:`fusionc.codegen.streamed`):
shared memory after the ring and the flush scratch (128-byte aligned, the units' layout at
:data:`fusionc.codegen.attn_units.PHASE_STAGES` stages); the partial slots after the phases'
split-K slots; the arrival counters before the error word (the last word)."""
from __future__ import annotations

SMEM_ALIGN = 128


def plan_counters(p, words: int) -> int:
    """Reserve the arrival counters of plan ``p``'s attention phase from word ``words`` (its
    ``att_counters``); returns the next free word."""
    from fusionc.codegen.attn_units import buffers, phase_geometry
    if p.attention is None:
        return words
    p.att_counters = words
    return words + buffers(p.attention, phase_geometry(p.attention, p.max_batch),
                           p.max_batch)[1]


def plan_smem(p, off: int) -> int:
    """Place the attention phase's shared memory of plan ``p`` at ``off`` (aligned): its
    ``att_smem``; returns the end."""
    from fusionc.codegen.attn_units import phase_geometry
    if p.attention is None:
        return off
    p.att_smem = -(-off // SMEM_ALIGN) * SMEM_ALIGN
    return p.att_smem + phase_geometry(p.attention, p.max_batch)["smem"]


def workspace(p, floats: int) -> int:
    """Place the attention phase's partial slots at float ``floats`` (its ``att_ws``); returns
    the workspace's floats in all."""
    from fusionc.codegen.attn_units import buffers, phase_geometry
    if p.attention is None:
        return floats
    p.att_ws = floats
    return floats + buffers(p.attention, phase_geometry(p.attention, p.max_batch),
                            p.max_batch)[0]


def setup(p, ctx) -> None:
    """The attention phase of plan ``p``: its file-level definitions into ``ctx.defs``, its
    consumers' code into the ``before`` of the phase that follows it."""
    from fusionc.codegen.attn_units import phase_code
    op = p.attention
    if op is None:
        return
    body = list(p.kernel.body)
    after = next(ph for ph in p.phases if body.index(ph.units) > body.index(op))
    wait = op.attr("wait")
    defs, code = phase_code(p.kernel, op, ctx.refs, f"fc_smem + {p.att_smem}",
                            f"fc_ws + {p.att_ws}", f"fc_counters + {p.att_counters}",
                            f"fc_counters + {p.counters[op.attr('signal')][0]}",
                            f"fc_counters + {p.counters[wait][0]}" if wait else "",
                            f"fc_counters + {p.words - 1}", ctx.stamps)
    ctx.defs += defs
    after.before = code
