"""Verifier checks of a streamed kernel's ``units`` region, as a whole: the ops that only make
sense per unit stay inside it, and the region's unit count, tiles, ring and batch agree (a
mismatch computes a wrong result on the GPU and in the simulator alike)."""
from __future__ import annotations

import math

from fusionc.ir.registry import fail

def inside_units(op, graph) -> None:
    """VerifyError unless ``op`` (a per-unit op) lies in the kernel's ``units`` region."""
    if graph is None:
        return
    units = [o for o in graph.body if o.name == "units"]
    if not any(x is op for u in units for x in u.regions[0]):
        fail(op, "a per-unit op outside the units region", "inside units() {...}")


def check_region(units, graph) -> None:
    """The region's tiles: ``count`` and ``group`` tile ``acc_gemv``'s weight, the ring's rows
    and the stage views agree with it, and the ring holds the kernel's batch bucket."""
    body = units.regions[0]
    rings = {o.result.name: o for o in graph.body if o.name == "ring_alloc"}
    for g in (o for o in body if o.name == "acc_gemv"):
        rows, cols, n, k = (g.attr(a) for a in ("rows", "cols", "n", "k"))
        kt = -(-k // cols)
        want = (-(-n // rows) * kt, kt)
        if (units.attr("count"), units.attr("group")) != want:
            fail(units, f"count {units.attr('count')}, group {units.attr('group')} for "
                        f"acc_gemv's [{n}, {k}] in {rows} x {cols} tiles",
                 f"count = {want[0]}, group = {want[1]}")
        for issue in (o for o in body if o.name == "ring_issue"):
            w, x = issue.operands[1].type, issue.operands[2].type
            if g.attr("head_rows"):   # a block-diagonal tile: its heads' attributes first
                from fusionc.ir.ops.tile_units import check_heads
                check_heads(g, x, w)
                continue
            if (math.prod(w.shape[:-1]), w.shape[-1]) != (n, k) or x.shape[1] != k:
                fail(g, f"n = {n}, k = {k} but ring_issue copies w {w} and x {x}",
                     f"n, k = {list(w.shape)}")
    check_tiles(units, graph)
    for st in (o for o in body if o.name == "ring_stage"):
        ring = rings.get(st.operands[0].name)
        if ring is not None and ring.attr("rows") != st.attr("rows"):
            fail(st, f"rows = {st.attr('rows')} of a ring of {ring.attr('rows')} weight rows",
                 f"rows = {ring.attr('rows')}")
    for w in (o for o in body if o.name == "counter_wait"):
        # reset = wait subtracts the target: one waiter per slot, i.e. one unit
        if w.attr("reset") == "wait" and not (
                w.attr("slot") == "unit" or (w.attr("slot") == "group" and
                                             units.attr("group") == 1)):
            fail(w, f"slot = {w.attr('slot')}: every unit (and CTA) of a slot waits on it, but a "
                    "wait resets the counter for one waiter", "slot = unit (or group with "
                    "groups of one unit), or reset = exit")
    mb = graph.attr("max_batch")
    for ring in rings.values():
        xrows = ring.result.type.shape[1] - ring.attr("rows")
        if xrows < mb:
            fail(ring, f"{xrows} activation rows per stage for max_batch = {mb}",
                 f"at least {mb} activation rows")


def check_tiles(units, graph) -> None:
    """What one tile feeds: ``acc_gemv`` and ``ring_issue`` agree on ``split``; a paired tile
    (``split = I``) reads a fused ``[2I, k]`` weight into ``y [B, I]``, an unpaired one writes
    ``y [B, n]``; the flush's operands are global inputs of the kernel (never ``y`` or a
    register value), a bias covers the weight rows, the norm weight has x's dtype; at most one
    ``row_rms`` (eps finite, >= 0) on an input."""
    body = units.regions[0]
    gemvs = [o for o in body if o.name == "acc_gemv"]
    flushes = [o for o in body if o.name == "group_flush"]
    params = {p.name for p in graph.params}
    outputs = {v.name for v in graph.outputs}
    for r in (o for o in graph.body if o.name == "row_rms"):
        if sum(o.name == "row_rms" for o in graph.body) > 1:
            fail(r, "a second row_rms", "one row_rms per kernel")
        if r.operands[0].name not in params or r.operands[0].name in outputs:
            fail(r, f"row_rms of %{r.operands[0].name}", "a kernel input the kernel does not write")
        if not 0 <= r.attr("eps") < float("inf"):
            fail(r, f"eps = {r.attr('eps')}", "a finite eps >= 0")
    for g, f in zip(gemvs, flushes):
        if f.operands[0].name != g.operands[0].name:
            fail(f, f"flushes %{f.operands[0].name} but the region's acc_gemv accumulates "
                    f"%{g.operands[0].name}", "the same accumulator")
        if list(body).index(f) < list(body).index(g):
            fail(f, "group_flush before the region's acc_gemv",
                 "group_flush after acc_gemv (and ring_release): a group's last unit is "
                 "summed before it is flushed")
        split, n = g.attr("split"), g.attr("n")
        for issue in (o for o in body if o.name == "ring_issue"):
            for a in ("split", "head_rows", "head_cols"):
                if issue.attr(a) != g.attr(a):
                    fail(issue, f"{a} = {issue.attr(a)} but acc_gemv has {g.attr(a)}",
                         f"{a} = {g.attr(a)}")
        y = f.operands[1].type
        cols = split if split else n
        if split and n != 2 * split:
            fail(g, f"split = {split} of a [{n}, k] weight", f"n = 2 * split = {2 * split}")
        if math.prod(y.shape[1:]) != cols:
            fail(f, f"output {y} from {'paired ' if split else ''}tiles of {cols} columns",
                 f"y [B, {cols}]")
        if len(g.operands) == 5 and g.operands[3].type.dtype != g.operands[1].type.dtype:
            fail(g, f"gamma {g.operands[3].type} for x {g.operands[1].type}", "one dtype")
        from fusionc.stream import epilogue
        steps = [s for s in epilogue.parse(f.attr("epilogue")) if epilogue.STEPS.get(s)]
        for s, v in zip(steps, f.operands[2:]):
            if v.name not in params or v.name in outputs:
                fail(f, f"{s} operand %{v.name}", "a kernel input the kernel does not write")
            if s == "bias" and v.type.shape != (n,):
                fail(f, f"bias {v.type} for {n} weight rows", f"a bias of shape [{n}]")
        every = epilogue.parse(f.attr("epilogue"))
        if epilogue.problem(every) is None and epilogue.paired(every) != bool(split):
            fail(f, f"epilogue {f.attr('epilogue')!r} with acc_gemv split = {split}",
                 "silu_mul exactly when the tiles are paired (acc_gemv split > 0)")


def check_phases(graph) -> None:
    """A kernel's phases (``units`` regions) agree on their chunk counters. The ``units``
    regions follow each other (no op between them), with one ``ring_alloc`` at most. A set
    that a flush signals (``group_flush {signal, per}``, phase p) is waited on only by a later
    phase, once, by its producer (before its TMA copies; pass ``insert-barriers`` adds the proxy
    fence after it), as ``counter_wait {slot = step, index = 0, reset = exit}`` with ``target = per`` and ``total`` = phase p's groups;
    ``per`` groups' columns make one K chunk of the waiting phase, whose groups are
    ``⌈total / per⌉`` chunks long and which reads the flush's output. Else a wait never returns,
    or returns before the chunk it guards is stored."""
    from fusionc.ir.ops.tile_units import phases_of
    from fusionc.ir.registry import lookup
    body = list(graph.body)
    phases = phases_of(graph)
    at = [i for i, o in enumerate(body) if lookup(o.name).has("units")]
    stray = [body[i] for i in range(at[0], at[-1]) if i not in at and
             body[i].name != "attn_units"] if at else []
    if stray:
        fail(stray[0], "an op between two units regions", "units regions one after the other "
             "(a phase's setup goes before the first), or an attention phase (attn_units)")
    rings = [o for o in body if o.name == "ring_alloc"]
    if len(rings) > 1:
        fail(rings[1], "a second ring_alloc", "one ring per kernel, shared by its phases")
    signals, written = {}, {}   # signal name -> (phase, flush, gemv, units); y -> (phase, flush)
    for p, u in enumerate(phases):
        gemv = next((o for o in u.regions[0] if o.name == "acc_gemv"), None)
        for f in (o for o in u.regions[0] if o.name == "group_flush"):
            written[f.operands[1].name] = (p, f)
            if f.attr("signal"):
                signals[f.attr("signal")] = (p, f, gemv, u)
    named = signals.keys() | {o.attr("name") for o in graph.walk() if o.name == "counter_signal"}
    att = {o.operands[5].name: o.attr("signal") for o in body if o.name == "attn_units"}
    named |= set(att.values()) - {""}
    for p, u in enumerate(phases):
        region = list(u.regions[0])
        for w in (o for o in region if o.name == "counter_wait"):
            if w.attr("name") not in named:
                fail(w, f"a wait on '{w.attr('name')}', which nothing in the kernel signals",
                     "a counter set that a group_flush {signal} or counter_signal adds to")
        waits = [o for o in region if o.name == "counter_wait" and o.attr("name") in signals]
        for w in waits:
            _check_chunk_wait(w, p, u, region, signals[w.attr("name")], len(waits))
        _check_reads(p, region, written)
        _check_attention_reads(region, att)
    for o in (o for o in body if o.name == "attn_units"):
        _check_attention_wait(o, written, signals, body)


def _check_attention_wait(op, written, signals, body) -> None:
    """An attention phase that reads ``qkv`` written by an earlier phase of the kernel waits
    for every group flush of it (``wait`` = that flush's signal, with one slot: ``per`` = its
    groups; ``wait_target`` = its groups), and waits on nothing else."""
    qkv = op.operands[0].name
    if qkv not in written and not op.attr("wait"):
        return
    want = "attn_units {wait = S, wait_target = G} after a phase whose group_flush of qkv has " \
           "signal = S, per = G (its G groups, one slot)"
    if qkv not in written or not op.attr("wait"):
        fail(op, f"an attention phase reading %{qkv} with wait = {op.attr('wait')!r}", want)
    p, flush = written[qkv]
    u = signals.get(op.attr("wait"), (None, None, None, None))[3]
    groups = -(-u.attr("count") // u.attr("group")) if u is not None else 0
    if flush.attr("signal") != op.attr("wait") or flush.attr("per") != groups or \
            op.attr("wait_target") != groups or body.index(u) > body.index(op):
        fail(op, f"wait = {op.attr('wait')!r}, wait_target = {op.attr('wait_target')} on a "
                 f"flush of {groups} groups with signal {flush.attr('signal')!r}, per = "
                 f"{flush.attr('per')}", want)


def _check_attention_reads(region, att: dict) -> None:
    """A phase that reads an attention phase's ``o`` (``att``: o → its signal) waits first for
    one signal per CTA (``counter_wait {name = signal, scale = grid}``, before its ring_issue);
    once the ring is planned (stream-plan) it reads ``o`` through it only (no plain loads;
    as an epilogue operand: :func:`check_tiles`)."""
    ring = any(o.name == "ring_issue" for o in region)
    for k, op in enumerate(region):
        if ring and op.name == "acc_gemv" and op.operands[1].name in att:
            fail(op, "a plain read of the attention units' output in a later phase",
                 "o read by the next phase's ring_issue only (TMA after every CTA's signal)")
        if op.name != "ring_issue" or op.operands[2].name not in att:
            continue
        sig = att[op.operands[2].name]
        if not sig or not any(o.name == "counter_wait" and o.attr("name") == sig and
                              o.attr("scale") == "grid" and o.attr("warp") == "producer"
                              for o in region[:k]):
            fail(op, f"a phase reads the attention units' %{op.operands[2].name} with no wait "
                     "on every CTA's signal", "attn_units {signal = NAME}, then counter_wait "
                     "{name = NAME, slot = const, scale = grid, reset = exit, warp = producer}, "
                     "fence_proxy_async, ring_claim, ring_issue")


def _check_reads(p, region, written) -> None:
    """A phase that reads what an earlier phase's flushes write waits on their chunk counters
    before reading (before its ring_issue, or its acc_gemv on the plain-load path)."""
    for k, op in enumerate(region):
        if op.name not in ("ring_issue", "acc_gemv"):
            continue
        x = op.operands[2] if op.name == "ring_issue" else op.operands[1]
        if x.name not in written or written[x.name][0] >= p:
            continue
        sp, flush = written[x.name]
        sig = flush.attr("signal")
        if not sig or not any(o.name == "counter_wait" and o.attr("name") == sig
                              for o in region[:k]):
            fail(op, f"phase {p} reads %{x.name}, which phase {sp}'s flushes write, with no "
                     f"counter_wait on {sig or 'their signal'!r} before it",
                 "group_flush {signal, per} in the writing phase; counter_wait {slot = step, "
                 "reset = exit, warp = producer}, fence_proxy_async, ring_claim, ring_issue "
                 "in the reading one")


def _check_chunk_wait(w, p, u, region, signal, n_waits) -> None:
    sp, flush, sgemv, su = signal
    groups = -(-su.attr("count") // su.attr("group"))
    per = flush.attr("per")
    want = dict(warp="producer", slot="step", index=0, reset="exit", target=per, total=groups)
    got = {a: w.attr(a) for a in want}
    if sp >= p or got != want or n_waits != 1:
        fail(w, f"a wait on '{w.attr('name')}' (signalled by phase {sp}'s flushes, {per} groups "
                f"per counter of {groups}) in phase {p} with " +
                ", ".join(f"{a} = {v}" for a, v in got.items()) +
                ("" if n_waits == 1 else f", one of {n_waits} such waits"),
             "one wait in a later phase with " + ", ".join(f"{a} = {v}" for a, v in want.items()))
    gemv = next((o for o in region if o.name == "acc_gemv"), None)
    if gemv is None or sgemv is None:
        return
    half = sgemv.attr("rows") // 2 if sgemv.attr("split") else sgemv.attr("rows")
    chunks = -(-groups // per)
    reads = {o.operands[2].name for o in region if o.name == "ring_issue"} | \
        {gemv.operands[1].name}
    if per * half != gemv.attr("cols") or u.attr("group") != chunks or \
            flush.operands[1].name not in reads:
        fail(w, f"chunks of {per} x {half} columns of %{flush.operands[1].name} for a phase "
                f"of {gemv.attr('cols')}-column K chunks, {u.attr('group')} per group",
             f"per x {half} = {gemv.attr('cols')}, {chunks} K chunks per group, and the phase "
             f"reads %{flush.operands[1].name}")
