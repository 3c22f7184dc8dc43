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
    for st in (o for o in body if o.name == "ring_stage"):
        ring = rings.get(st.operands[0].name)
        if ring is not None and ring.attr("rows") != st.attr("rows"):
            fail(st, f"rows = {st.attr('rows')} of a ring of {ring.attr('rows')} weight rows",
                 f"rows = {ring.attr('rows')}")
    for w in (o for o in body if o.name == "counter_wait"):
        # the wait subtracts its target: one waiter per slot, i.e. one unit
        if not (w.attr("slot") == "unit" or (w.attr("slot") == "group" and
                                              units.attr("group") == 1)):
            fail(w, f"slot = {w.attr('slot')}: every unit (and CTA) of a slot waits on it, but a "
                    "wait resets the counter for one waiter", "slot = unit (or group with "
                    "groups of one unit)")
    mb = graph.attr("max_batch")
    for ring in rings.values():
        xrows = ring.result.type.shape[1] - ring.attr("rows")
        if xrows < mb:
            fail(ring, f"{xrows} activation rows per stage for max_batch = {mb}",
                 f"at least {mb} activation rows")
