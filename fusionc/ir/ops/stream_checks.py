"""Verifier checks of a streamed kernel's ``units`` region, as a whole: the ops that only make
sense per unit stay inside it, and the region's unit count, tiles, ring and batch agree (a
mismatch computes a wrong result on the GPU and in the simulator alike)."""
from __future__ import annotations

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
            if w.shape != (n, k) or x.shape[1] != k:
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
        split, n = g.attr("split"), g.attr("n")
        for issue in (o for o in body if o.name == "ring_issue"):
            if issue.attr("split") != split:
                fail(issue, f"split = {issue.attr('split')} but acc_gemv has {split}",
                     f"split = {split}")
        y = f.operands[1].type
        cols = split if split else n
        if split and n != 2 * split:
            fail(g, f"split = {split} of a [{n}, k] weight", f"n = 2 * split = {2 * split}")
        if y.shape[1] != cols:
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
    """A kernel's phases (``units`` regions) agree on their chunk counters: each
    ``counter_wait {reset = exit}`` waits on a set that a flush of an earlier phase signals
    (``group_flush {signal, per}``) with ``target = per`` and ``total`` = that phase's groups,
    and a set signalled by flushes is waited on only that way (else a wait never returns, or
    returns before the chunk it guards is stored)."""
    from fusionc.ir.registry import lookup
    phases = [o for o in graph.body if lookup(o.name).has("units")]
    signals = {}   # name -> (phase, per, groups)
    for p, u in enumerate(phases):
        groups = -(-u.attr("count") // u.attr("group"))
        for f in (o for o in u.regions[0] if o.name == "group_flush" and o.attr("signal")):
            signals[f.attr("signal")] = (p, f.attr("per"), groups)
    for p, u in enumerate(phases):
        for w in (o for o in u.regions[0] if o.name == "counter_wait"):
            got = signals.get(w.attr("name"))
            if got is None:
                continue
            sp, per, groups = got
            if sp >= p or w.attr("reset") != "exit" or \
                    (w.attr("target"), w.attr("total")) != (per, groups):
                fail(w, f"a wait on '{w.attr('name')}' (signalled by phase {sp}'s flushes, "
                        f"{per} groups per counter of {groups}) in phase {p} with target = "
                        f"{w.attr('target')}, total = {w.attr('total')}, reset = "
                        f"{w.attr('reset')}", f"in a later phase, target = {per}, total = "
                        f"{groups}, reset = exit")
