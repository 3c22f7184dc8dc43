"""Tile IR: work units, accumulators and grid-level counters of persistent kernels (design v2 §1).

``units() {count, group, schedule = contiguous} ({ body })``
    The body runs once per work unit of this CTA, in order (:class:`fusionc.stream.UnitSchedule`:
    CTA ``c`` of ``G = gridDim.x`` runs units ``[c·count // G, (c+1)·count // G)``); unit ``u``
    is step ``s = u % group`` of group ``g = u // group``. Ops with the ``producer`` trait run
    in the CTA's producer warp (``ring_claim``, ``ring_issue``), the others in its consumer
    warps; the two interleave freely, ordered only by the ring's mbarriers. The grid is
    persistent: its size comes from the occupancy at load time (never from the model), at most
    the largest ``count``. Only at the top level of a kernel. A kernel may hold several:
    *phases*, run one after the other by each role of every CTA (the producer may stream a
    later phase's weights while the consumers finish an earlier one); the ring's stage index
    ``j`` counts the CTA's units over all phases. A phase that reads what an earlier phase
    wrote waits on the counters that phase's flushes signal: every CTA of the grid must then be
    resident at once (the runtime launches at most the resident CTAs).
``%acc = acc_alloc() : f32[B, rows]``
    An fp32 accumulator of one output tile (registers of the consumer threads), zero.
``acc_gemv(%acc, %x, %w, %gamma?, %r?) {rows, cols, n, k, split = 0}``
    ``acc[b, r] += Σ_c x_t[b, c] · w_t[r, c]`` over the current unit's tile: rows
    ``[g·rows, +rows)`` of the ``[n, k]`` weight and columns ``[s·cols, +cols)``; elements past
    ``n`` or ``k`` count as 0. ``%x``/``%w`` are the global tensors (plain loads: weight rows
    TMA cannot copy) or the stage views of a ring (``ring_stage``). fp32 products and sums.
    ``split = I > 0``: a paired tile (gate and up rows of a fused ``[2I, k]`` weight): tile row
    ``r < rows/2`` is weight row ``g·rows/2 + r`` and row ``rows/2 + r`` is ``I + g·rows/2 + r``.
    With ``%gamma: [k]`` and ``%r: f32[B]`` (an RMSNorm's weight and the rows' 1/rms from
    ``row_rms``), x's elements are first normed in x's dtype
    (:func:`fusionc.stream.epilogue.norm_activations`: one rounding of ``x · r · gamma``, two
    packed multiplies for f16), as ``rms_norm`` computes them (Zhang & Sennrich 2019, eq. 4).
    ``head_rows = R, head_cols = C``: block-diagonal (``head_linear``, one ``[R, k]`` matrix per
    head): group ``g`` belongs to head ``h = g·rows / R`` and reads x's columns
    ``[h·C + s·cols, +cols)`` (:func:`fusionc.stream.ring.head_column`); w ``[H, R, k]`` and x
    ``[B, H·C]`` or ``[B, H, C]`` are read as their 2D row views.
``%r = row_rms(%x) {eps} : f32[B]``
    At the top level of a streamed kernel: each CTA computes ``r[b] = 1 / sqrt(mean_c x[b, c]²
    + eps)`` (fp32) of the global ``[B, K]`` activations itself (RMSNorm, Zhang & Sennrich 2019,
    eq. 4), after the previous kernel finished.
``group_flush(%acc, %y, %extra*) {rows, epilogue = ""}``
    At the current group's last unit, or the CTA's last unit: the group's output tile
    ``y[b, g·rows + r] = round(epilogue(Σ_c acc_c[b, r]))``, the partial accumulators of the
    group's contributing CTAs (:meth:`UnitSchedule.contributors`) added in CTA order by the last
    to arrive (split-K over CTAs, deterministic; no CTA waits); then ``acc`` is zero again.
    Columns past ``y``'s columns are dropped; a ``y`` of rank 3 is ``[B, H·N]`` flat. ``epilogue``: steps with one ``%extra`` operand
    each where they take one (``bias``, ``silu``, ``silu_mul``, ``add``, ``mul``, ``round_*``;
    :mod:`fusionc.stream.epilogue`); with ``silu_mul`` the group writes ``rows/2`` columns.
    ``signal = NAME`` (with ``per``): once the group's tile is stored, its writer releases
    (GPU scope) and adds 1 to counter ``NAME[g // per]``: a later phase that reads ``y`` in K
    chunks of ``per`` groups' columns waits on the chunk's counter.
``counter_signal() {name, slot = const|group|unit, index, warp = consumer|producer}``
    Release (GPU scope) then add 1 to counter ``name[slot]`` (slot = ``index``, or
    ``index + g``, or ``index + u``).
``counter_wait() {name, slot, index, target, total = 0, reset = wait}``
    Spin (acquire, GPU scope, bounded: after 2 s a host-visible error flag is set and the wait
    gives up) until ``name[slot] >= target``; ``slot = step`` is ``index + s``. ``total = T``:
    the slots share T signals, ``target`` per slot and the rest in the last
    (:func:`fusionc.stream.schedule.wait_target`). ``reset = wait``: the wait subtracts its
    target, so counters return to zero by themselves and CUDA-graph replays need no host reset
    (one waiter per slot); ``reset = exit``: any number of waiters, and the last CTA to leave
    the kernel sets the counter set back to zero. A wait may only wait on units with lower
    tickets (earlier units or earlier phases), so that it cannot deadlock on a resident grid.
    ``scale = grid``: the target is ``target`` signals per CTA of the launch (an attention
    phase's CTAs each signal once: ``attn_units {signal}``); only with ``slot = const`` and
    ``reset = exit``, where the wait is done once per phase (it stays met).
"""
from __future__ import annotations

from fusionc.ir.ops.tile_memory import K, param_of
from fusionc.ir.registry import (FLOAT, POS_INT, NONNEG_INT, STR, Cost, OpDef, attr, enum, fail,
                                 register)
from fusionc.ir.types import DType, TensorType


def _sim(method):
    """A simulator rule that hands the op to the CTA's stream state (``fusionc.sim.grid``)."""
    def rule(op, args, cta):
        stream = getattr(cta, "stream", None)
        if stream is None:
            from fusionc.errors import SimulationError
            raise SimulationError("a work-unit op outside a units region of a streamed kernel",
                                  op=op.name, loc=op.loc, valid="inside units() {...}")
        return getattr(stream, method)(op, args)
    return rule


def _infer_units(op):
    if op.attr("group") > op.attr("count"):
        fail(op, f"groups of {op.attr('group')} units of {op.attr('count')}",
             "group <= count")
    return ()


def _verify_units(op, graph, module):
    if graph is None:
        return
    if not any(o is op for o in graph.body):
        fail(op, "units inside a region", "units() at the top level of the kernel")
    from fusionc.ir.ops.stream_checks import check_phases, check_region
    check_region(op, graph)
    if next(o for o in graph.body if o.name == "units") is op:   # once per kernel
        check_phases(graph)


def _infer_acc(op):
    if len(op.results) != 1 or op.result.type.rank != 2 or op.result.type.dtype != DType.f32:
        fail(op, "acc_alloc has one f32[B, rows] result", "%acc = acc_alloc() : f32[B, 64]")
    return (op.result.type,)


def _infer_gemv(op):
    acc, x, w = (v.type for v in op.operands[:3])
    split = op.attr("split")
    if split and (op.attr("rows") % 2 or split >= op.attr("n")):
        fail(op, f"split = {split} of {op.attr('n')} weight rows in tiles of {op.attr('rows')}",
             "an even tile and 0 < split < n (the up rows' offset)")
    norm = op.operands[3:]
    if norm and (len(norm) != 2 or norm[0].type.shape != (op.attr("k"),) or
                 norm[1].type.rank != 1 or norm[1].type.dtype != DType.f32):
        fail(op, "norm operands " + ", ".join(str(v.type) for v in norm),
             f"none, or gamma [{op.attr('k')}] and the rows' 1/rms f32[B] (row_rms)")
    rows, cols, n, k = (op.attr(a) for a in ("rows", "cols", "n", "k"))
    if acc.dtype != DType.f32 or acc.rank != 2 or acc.shape[1] != rows:
        fail(op, f"accumulator {acc}", f"f32[B, {rows}]")
    if x.dtype != w.dtype:
        fail(op, f"x {x}, w {w}", "x and w of one dtype")
    if w.shape == (rows, cols) and x.rank == 2 and x.shape[1] == cols:
        return ()   # stage views (check_region checks the heads against ring_issue's tensors)
    if op.attr("head_rows"):
        check_heads(op, x, w)
    elif w.shape != (n, k) or x.rank != 2 or x.shape[1] != k:
        fail(op, f"x {x}, w {w} for tiles [{rows}, {cols}] of [{n}, {k}]",
             f"the global tensors [B, {k}] and [{n}, {k}], or stage views [xrows, {cols}] and "
             f"[{rows}, {cols}]")
    return ()


def check_heads(op, x: TensorType, w: TensorType, k: int | None = None) -> None:
    """VerifyError unless the global ``x`` and ``w`` of a block-diagonal linear (``head_rows
    = R``, ``head_cols = C``) fit: ``H`` heads, weight ``[H, R, k]`` (or ``[H·R, k]``),
    activations ``[B, H·C]`` (or ``[B, H, C]``) with ``k <= C``; on ``acc_gemv`` (its ``rows``,
    ``n`` and ``k``) also tiles that never straddle two heads (``R`` a multiple of rows)."""
    attrs = dict(op.attrs)
    hr, hc = op.attr("head_rows"), op.attr("head_cols")
    if not all(isinstance(d, int) for d in w.shape):
        fail(op, f"w {w} of a block-diagonal linear (head_rows = {hr})",
             "a weight of static sizes [H, R, K] or [H·R, K]")
    n = attrs.get("n", w.shape[0] * (w.shape[1] if w.rank == 3 else 1))
    k, rows = attrs.get("k", k), attrs.get("rows", hr)
    heads = n // hr if hr and isinstance(n, int) and n % hr == 0 else 0
    if not heads or hr % rows or op.attr("split") or not isinstance(k, int) or k > hc:
        fail(op, f"head_rows = {hr}, head_cols = {hc} for tiles of {rows} rows of [{n}, {k}]",
             "head_rows dividing n, a multiple of rows, no split, and k <= head_cols")
    if w.shape not in ((heads, hr, k), (n, k)) or \
            x.shape[1:] not in ((heads * hc,), (heads, hc)):
        fail(op, f"x {x}, w {w} for {heads} heads",
             f"w [{heads}, {hr}, {k}] or [{n}, {k}], x [B, {heads * hc}] or [B, {heads}, {hc}]")


def _cost_gemv(op, env):
    acc, x, w = op.operands
    b = acc.type.numel(env) // op.attr("rows")
    rows, cols = op.attr("rows"), op.attr("cols")
    return Cost(flops=2 * b * rows * cols)


def _infer_flush(op):
    from fusionc.stream import epilogue
    acc, y = op.operands[0].type, op.operands[1].type
    if y.rank < 2 or acc.rank != 2 or acc.shape[0] != y.shape[0] or \
            acc.shape[1] != op.attr("rows") or y.rank > 2 and not all(isinstance(d, int) for d in y.shape[1:]):
        fail(op, f"accumulator {acc}, output {y}",
             "acc f32[B, rows] and y [B, N] (or [B, H, N/H]: its rows flat)")
    steps = epilogue.parse(op.attr("epilogue"))
    why = epilogue.problem(steps)
    if why:
        fail(op, f"epilogue {op.attr('epilogue')!r}: {why}",
             "steps of " + ", ".join(epilogue.STEPS) + "; only bias before silu_mul")
    extras = op.operands[2:]
    if len(extras) != epilogue.operands(steps):
        fail(op, f"{len(extras)} epilogue operands for {op.attr('epilogue')!r}",
             f"{epilogue.operands(steps)}: one each for bias, add and mul, in order")
    for s, v in zip((s for s in steps if epilogue.STEPS[s]), extras):
        t = v.type
        ok = {"bias": t.rank == 1, "add": t.shape == y.shape, "mul": t.shape == y.shape}[s]
        if not ok:
            want = {"bias": "[N] (weight rows)", "add": f"{y.shape}", "mul": f"{y.shape}"}[s]
            fail(op, f"{s} operand %{v.name}: {t}", want)
    return ()


def _infer_rms(op):
    x = op.operands[0].type
    if x.rank != 2 or len(op.results) > 1:
        fail(op, f"row_rms of {x}", "%r = row_rms(%x) : f32[B] of x [B, K]")
    return (TensorType(DType.f32, (x.shape[0],)),)


def _verify_flush(op, graph, module):
    from fusionc.ir.ops.stream_checks import inside_units
    from fusionc.ir.ops.tile_memory import _verify_store
    inside_units(op, graph)
    _verify_store(op.replace(operands=op.operands[1:]), graph, module)


def _verify_gemv(op, graph, module):
    from fusionc.ir.ops.stream_checks import inside_units
    inside_units(op, graph)
    for v in op.operands[1:]:
        if graph is not None and any(p.name == v.name for p in graph.params):
            param_of(op, graph, v, "operand")


HEADS = (attr("head_rows", NONNEG_INT, 0, omit=True,
               doc="block-diagonal linear: weight rows per head (0: none)"),
          attr("head_cols", NONNEG_INT, 0, omit=True, doc="activation columns per head"))
_WARP = attr("warp", enum("consumer", "producer"), "consumer", omit=True,
             doc="which warps run it: the producer waits before TMA reads of data others wrote")
_slot = (attr("name", STR, doc="counter set"),
         attr("slot", enum("const", "group", "unit", "step"), "const"),
         attr("index", NONNEG_INT, 0),
         _WARP)


def units_op(kernel):
    """The ``units`` region of a streamed kernel (an op with the ``units`` trait), or None."""
    from fusionc.ir.registry import lookup
    return next((op for op in kernel.body if lookup(op.name).has("units")), None)


def phases_of(kernel) -> list:
    """The kernel's ``units`` regions (its phases), in order; the simulator, the passes, the
    verifier, the cost model and codegen all ask this."""
    from fusionc.ir.registry import lookup
    return [op for op in kernel.body if lookup(op.name).has("units")]


def in_producer(op) -> bool:
    """Whether ``op`` runs in a streamed kernel's producer warp (the ``producer`` trait, or
    ``warp = producer`` on counter ops and fences); the simulator and codegen both ask this."""
    from fusionc.ir.registry import lookup
    if lookup(op.name).has("producer"):
        return True
    return dict(op.attrs).get("warp") == "producer"

register(OpDef("units", __doc__, (),
               (attr("count", POS_INT, doc="work units"), attr("group", POS_INT, 1),
                attr("schedule", enum("contiguous"), "contiguous")),
               _infer_units, where=K, regions=1, simulate=_sim("units_outside"),
               verify=_verify_units, traits=frozenset({"units"})))
register(OpDef("acc_alloc", __doc__, (), (), _infer_acc, where=K, simulate=_sim("acc_alloc")))
register(OpDef("acc_gemv", __doc__, ("acc", "x", "w", "norm*"),
               (attr("rows", POS_INT), attr("cols", POS_INT), attr("n", POS_INT),
                attr("k", POS_INT), attr("split", NONNEG_INT, 0, omit=True,
                                         doc="paired gate/up tile: the up rows' offset")) +
               HEADS,
               _infer_gemv, where=K, simulate=_sim("acc_gemv"), verify=_verify_gemv,
               cost=_cost_gemv, traits=frozenset({"accumulates"})))
register(OpDef("row_rms", __doc__, ("x",), (attr("eps", FLOAT),), _infer_rms, where=K,
               simulate=_sim("row_rms")))
register(OpDef("group_flush", __doc__, ("acc", "y", "extra*"),
               (attr("rows", POS_INT), attr("epilogue", STR, "", omit=True,
                                            doc="steps, comma-separated"),
                attr("signal", STR, "", omit=True, doc="counter set a stored tile signals"),
                attr("per", POS_INT, 1, omit=True, doc="groups per signalled counter")),
               _infer_flush, where=K, simulate=_sim("flush"), verify=_verify_flush,
               traits=frozenset({"accumulates"})))
register(OpDef("counter_signal", __doc__, (), _slot, lambda op: (), where=K,
               simulate=_sim("signal"), traits=frozenset({"counter"})))
def _verify_wait(op, graph, module):
    from fusionc.ir.ops.stream_checks import inside_units
    inside_units(op, graph)
    if op.attr("scale") == "grid" and (op.attr("slot"), op.attr("reset"), op.attr("total")) != \
            ("const", "exit", 0):
        fail(op, f"scale = grid with slot = {op.attr('slot')}, reset = {op.attr('reset')}, "
                 f"total = {op.attr('total')}", "scale = grid only with slot = const, "
                 "reset = exit and no total")


register(OpDef("counter_wait", __doc__, (), _slot + (
                   attr("target", POS_INT, 1), attr("total", NONNEG_INT, 0, omit=True),
                   attr("reset", enum("wait", "exit"), "wait", omit=True),
                   attr("scale", enum("one", "grid"), "one", omit=True)),
               lambda op: (), where=K, simulate=_sim("counter_wait"), verify=_verify_wait,
               traits=frozenset({"counter"})))
