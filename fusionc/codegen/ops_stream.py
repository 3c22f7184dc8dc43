"""Emitters of the ops inside a streamed kernel's ``units`` region (see
:mod:`fusionc.codegen.streamed`). Each returns the C++ of one op for one unit; the loop variables
are ``fc_u`` (unit), ``fc_j`` (the CTA's ``j``-th unit), ``fc_g`` (group), ``fc_s`` (step),
``fc_u0``/``fc_u1`` (the CTA's units), ``fc_lane``. The mbarrier parities and stages follow
:mod:`fusionc.stream.ring` (the simulator's definition)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from fusionc.codegen import cnames
from fusionc.errors import CompileError
from fusionc.ir.kernel import ring_geometry
from fusionc.ir.nodes import Op
from fusionc.stream.ring import empty_parity_c, full_parity_c, head_column_c


@dataclass
class StreamCtx:
    """What the emitters share: the plan, parameter pointers, per-role setup code."""

    plan: object
    refs: dict                     # IR parameter name -> C pointer
    producer_setup: str = ""       # the producer's code before every phase
    consumer_setup: str = ""
    staged: set = field(default_factory=set)   # consumer prologue pieces emitted: once each
    views: dict = field(default_factory=dict)   # stage-view value -> C expression
    epilogues: list = field(default_factory=list)  # each flush's functor (stream.epilogue)
    phase: object = None           # the Phase being emitted (fusionc.codegen.streamed)
    defs: str = ""                 # file-level code (an attention phase's geometry)
    stamps: object = None          # timeline stamps (fusionc.codegen.stream_timeline.Stamps)

    def ptr(self, v) -> str:
        return self.refs[v.name]


EMIT = {}


def emits(name):
    def wrap(fn):
        EMIT[name] = fn
        return fn
    return wrap


def emit(op: Op, ctx: StreamCtx) -> str:
    """The C++ of ``op`` inside the unit loop (CompileError if it has no emitter here)."""
    fn = EMIT.get(op.name)
    if fn is None:
        raise CompileError("no code generation for this op in a streamed kernel", op=op.name,
                           loc=op.loc, valid=", ".join(sorted(EMIT)))
    return fn(op, ctx)


def _geo(ctx):
    return ring_geometry(ctx.plan.ring)


@emits("ring_claim")
def _claim(op, ctx):
    """The wait for the stage's release; a phase's first S units were claimed by its prologue
    (:func:`_weight_prologue`; in phase 0 their stages are fresh)."""
    s = _geo(ctx).stages
    po = op.attr("parity_offset")
    return (f"if (fc_i >= {s} && fc_j >= {s}) fc_mbar_wait(&fc_empty[fc_j % {s}], "
            f"{empty_parity_c('fc_j', s, po)});  // empty_parity(j)")


@emits("ring_issue")
def _issue(op, ctx):
    geo = _geo(ctx)
    w, x = op.operands[1], op.operands[2]
    if not all(isinstance(d, int) for d in w.type.shape):
        raise CompileError(f"weight {w.type} with symbolic dims", op=op.name, loc=op.loc,
                           valid="static [N, K]")
    ph = ctx.phase
    if "fc_issue_w" not in ph.producer_setup:
        ph.producer_setup += _weight_prologue(ctx, geo, w, x)
    x0 = head_column_c("fc_g", geo.rows, op.attr("head_rows"), op.attr("head_cols"))
    xs = "\n".join(f"  fc_tma_2d(stage + {geo.box_offset('x', h)}, &{tmap(x)}, "
                   f"{x0}fc_s * {geo.cols} + {h * geo.box_cols}, 0, &fc_full[st], fc_pol_x);"
                   for h in (0, 1))
    return f"""const int st = fc_j % {geo.stages};
unsigned char* stage = fc_ring + st * {geo.stage_bytes};
if (fc_lane == 0) {{  // weight boxes (issued ahead for the first stages), then activation boxes
  if (fc_i >= {geo.stages}) fc_issue_w(fc_j, fc_u);
{xs}
}}"""


def _weight_prologue(ctx, geo, w, x) -> str:
    """The producer's code before a phase's units: ``fc_issue_w`` (arm a stage and copy its
    weight boxes) and the weight boxes of the phase's first S units, claimed as the consumers
    free their stages — weights are never written by a kernel, so they stream before any wait:
    in phase 0 before ``griddepcontrol.wait`` (the previous kernel may still run, PDL), in a
    later phase before the counters its activation boxes wait on. The L2 policies and
    tensor-map prefetches go once into the producer's setup."""
    split, ph = ctx.phase.split, ctx.phase
    boxes = [(0, f"g * {geo.rows}")] if not split else [
        (0, f"g * {geo.rows // 2}"), (geo.rows // 2 * 128, f"{split} + g * {geo.rows // 2}")]
    ws = "\n".join(f"  fc_tma_2d(stage + {geo.box_offset('w', h) + off}, &{tmap(w)}, "
                    f"s * {geo.cols} + {h * geo.box_cols}, {row}, &fc_full[st], fc_pol_w);"
                    for h in (0, 1) for off, row in boxes)
    if "fc_pol_w" not in ctx.producer_setup:
        ctx.producer_setup += ("const unsigned long long fc_pol_w = fc_policy_evict_first();\n"
                               "const unsigned long long fc_pol_x = fc_policy_evict_last();\n")
    for v in (w, x):
        if f"&{tmap(v)})" not in ctx.producer_setup:
            ctx.producer_setup += f"if (fc_lane == 0) fc_prefetch_tensormap(&{tmap(v)});\n"
    s = geo.stages
    po = next((op.attr("parity_offset") for op in ph.units.regions[0]
               if op.name == "ring_claim"), 0)   # the claims this prologue makes early
    claim = "" if ph.index == 0 else (
        f"\n    if (fc_j + j >= {s}) fc_mbar_wait(&fc_empty[(fc_j + j) % {s}], "
        f"{empty_parity_c('(fc_j + j)', s, po)});")
    code = f"""auto fc_issue_w = [&](int j, int u) {{  // arm stage j % S, copy unit u's weight boxes
  const int st = j % {s}, g = u / {ph.group}, s = u % {ph.group};
  unsigned char* stage = fc_ring + st * {geo.stage_bytes};
  fc_mbar_expect_tx(&fc_full[st], {geo.copy_bytes}u);
{ws}
}};
if (fc_lane == 0) {{
  for (int j = 0; j < {s} && fc_u0 + j < fc_u1; ++j) {{{claim}
    fc_issue_w(fc_j + j, fc_u0 + j);
  }}
}}
"""
    if ph.index == 0:
        code += "fc_grid_dependency_wait();  // PDL: the activations may come from the previous kernel\n"
    return code


def tmap(v) -> str:
    """The kernel parameter holding the tensor map of global tensor ``v``."""
    return cnames.ident("fc_tm", v.name)


@emits("ring_wait")
def _wait(op, ctx):
    s = _geo(ctx).stages
    po = op.attr("parity_offset")
    return f"fc_mbar_wait(&fc_full[fc_j % {s}], {full_parity_c('fc_j', s, po)});  // full_parity(j)"


@emits("ring_stage")
def _stage(op, ctx):
    tw, tx = op.results
    ctx.views[tw.name] = "fc_sw"
    ctx.views[tx.name] = "fc_sx"
    return "// the stage's weight rows (fc_sw) and activation rows (fc_sx): views, no code"


def stage_decls(ctx) -> str:
    """The consumer loop's pointers to the current unit's stage (``fc_sw`` weight rows,
    ``fc_sx`` activation rows)."""
    geo = _geo(ctx)
    return (f"const unsigned char* const fc_sw = fc_ring + (fc_j % {geo.stages}) * "
            f"{geo.stage_bytes};\nconst unsigned char* const fc_sx = fc_sw + "
            f"{geo.box_offset('x', 0)};\n(void)fc_sw; (void)fc_sx;")


@emits("ring_release")
def _release(op, ctx):
    return f"__syncwarp();\nif (fc_lane == 0) fc_mbar_arrive(&fc_empty[fc_j % {_geo(ctx).stages}]);"


@emits("fence_proxy_async")
def _fence(op, ctx):
    if _polls(op, ctx):   # after a chunk poll only: later units' chunks were acquired with it
        return "if (fc_polled) fc_fence_proxy_async_global();\nfc_polled = false;"
    return "fc_fence_proxy_async_global();"


def _polls(op, ctx) -> bool:
    """Whether ``op``'s phase waits on chunks by warp polls (:func:`_cwait`)."""
    return op.attr("warp") == "producer" and any(
        o.name == "counter_wait" and (_is_poll(o) or _once(o))
        for o in ctx.phase.units.regions[0])


def _once(op) -> bool:
    """A wait on one signal per CTA (``scale = grid``: slot const, reset exit): once met it
    stays met, so the producer waits at its first unit of the phase only."""
    return op.attr("scale") == "grid"


def _is_poll(op) -> bool:
    return op.attr("reset") == "exit" and op.attr("slot") == "step" and \
        op.attr("warp") == "producer"


@emits("acc_gemv")
def _gemv(op, ctx):
    p = ctx.plan
    acc, x, w = op.operands[:3]
    dt = w.type.dtype
    ct, v = cnames.ctype(dt), 16 // dt.itemsize
    n, k = op.attr("n"), op.attr("k")
    m = cnames.dim(acc.type.shape[0])
    gamma = _stage_gamma(op, ctx, ct) if len(op.operands) == 5 else "nullptr"
    rms = "fc_rms" if len(op.operands) == 5 else "nullptr"
    _acc_decl(ctx, acc)
    if p.path == "plain":
        if op.attr("head_rows"):
            raise CompileError("a block-diagonal linear on the plain-load path", op=op.name,
                               loc=op.loc, valid="rows TMA copies (the lowering keeps other "
                               "head_linear ops on the host)")
        if "pdl_wait" not in ctx.staged:
            ctx.staged.add("pdl_wait")
            ctx.consumer_setup += "fc_grid_dependency_wait();  // PDL: x from the previous kernel\n"
        return (f"fc_acc_fma_global<{p.rows // 16}, {p.max_batch}, {v}, {ct}>(fc_acc, "
                f"{ctx.ptr(x)}, {ctx.ptr(w)}, {gamma}, {rms}, {m}, {n}, {k}, fc_g, {p.rows}, "
                f"{op.attr('split')}, fc_s * {p.cols});")
    geo = _geo(ctx)
    if p.path == "mma":
        fn = "fc_acc_wgmma_smem" if p.wgmma else "fc_acc_mma_smem"
        return (f"{fn}<{p.nb}, {geo.rows}, {geo.xbox_rows}, {geo.cols}, {ct}>("
                f"fc_acc, fc_sw, fc_sx, {gamma}, {rms}, fc_s * {geo.cols}, {k});")
    return (f"fc_acc_fma_smem<{p.rows // 16}, {p.max_batch}, {v}, {geo.rows}, {geo.xbox_rows}, "
            f"{ct}>(fc_acc, fc_sw, fc_sx, {gamma}, {rms}, {m}, fc_s * {geo.cols}, {k});")


def _stage_gamma(op, ctx, ct) -> str:
    """The consumers' prologue that copies the norm weight into shared memory (``fc_gamma``):
    read by every unit, so from shared memory rather than through L2 at each k-step."""
    from fusionc.codegen.stream_layout import gamma_elems
    p = ctx.plan
    if "gamma" in ctx.staged:   # sibling phases: one prologue, staged once
        return "fc_gamma"
    ctx.staged.add("gamma")
    kp = gamma_elems(p, op)
    ctx.consumer_setup = (
        f"{ct}* const fc_gamma = reinterpret_cast<{ct}*>(fc_smem + {p.gamma_off});\n"
        f"fc_stage_gamma<256>({ctx.ptr(op.operands[3])}, {op.attr('k')}, {kp}, fc_gamma);\n"
        "fc_consumer_sync<256>();\n") + ctx.consumer_setup
    return "fc_gamma"


def _acc_decl(ctx, acc) -> None:
    p = ctx.plan
    if "acc" in ctx.staged:
        return
    ctx.staged.add("acc")
    shape = f"[{p.nb}][4]" if p.path == "mma" else f"[{p.rows // 16}][{p.max_batch}]"
    ctx.consumer_setup += (f"float fc_acc{shape};  // %{acc.name}: registers\n"
                           f"for (auto& row : fc_acc) for (float& a : row) a = 0.f;\n")


@emits("group_flush")
def _flush(op, ctx):
    from fusionc.stream import epilogue
    p, ph = ctx.plan, ctx.phase
    acc, y = op.operands[0], op.operands[1]
    steps = epilogue.parse(op.attr("epilogue"))
    extras = op.operands[2:]
    epi = f"FcEpi{ph.index}"
    ctx.epilogues.append(epilogue.c_struct(steps, cnames.ctype(y.type.dtype),
                                           [cnames.ctype(v.type.dtype) for v in extras],
                                           ph.split, epi))
    n = math.prod(y.type.shape[1:])   # a rank-3 output is [B, H·N] flat
    m = cnames.dim(y.type.shape[0])
    half = p.rows // 2 if epilogue.paired(steps) else p.rows
    ptrs = ", ".join([ctx.ptr(y)] + [ctx.ptr(v) for v in extras])
    cnt, grp = ph.count, ph.group
    sig = "nullptr"
    if op.attr("signal"):
        first, _, stride = p.counters[op.attr("signal")]
        sig = f"fc_counters + {first} + fc_g / {op.attr('per')} * {stride}"
    head = f"""if (fc_s == {grp - 1} || fc_u == fc_u1 - 1) {{  // the group's last unit here
  const int gc0 = fc_unit_cta(fc_g * {grp}, {cnt}, fc_G);
  const int gc1 = fc_unit_cta(min({cnt}, (fc_g + 1) * {grp}) - 1, {cnt}, fc_G);
  const int slot = 2 * blockIdx.x + (fc_g == fc_u0 / {grp} ? 0 : 1);
  const int slot0 = 2 * gc0 + (fc_g == fc_unit_start(gc0, {cnt}, fc_G) / {grp} ? 0 : 1);
  volatile int* flag = reinterpret_cast<volatile int*>(fc_smem + {p.scratch_off});
  const {epi} epi{{{ptrs}, {n}, {m}, fc_g * {half}}};
"""
    tail = (f"epi, gc0 == gc1, fc_ws + {ph.ws_off}, slot, fc_counters + {ph.flush_base} + "
            f"fc_g, gc0, gc1, slot0, fc_u == fc_u1 - 1, flag, {sig});\n}}")
    if p.path == "mma":
        return head + (f"  fc_flush_mma<{256}, {p.nb}, {p.rows}, {p.max_batch}>(fc_acc, "
                       f"reinterpret_cast<float*>(fc_smem + {p.scratch_off + 16}), " + tail)
    return head + f"  fc_flush_fma<{256}, {p.rows // 16}, {p.rows}, {p.max_batch}>(fc_acc, " + tail


def exit_code(ctx) -> tuple[str, str]:
    """(producer, consumer) code after the last phase: with ``reset = exit`` counters, every
    CTA counts itself out once its last wait passed and the last zeroes them
    (``fc_counters_exit``). When every such wait is the producer's (chunk polls), the producer
    counts out after its last copy, off the consumers' path: each counter of a set has a
    waiter whose target is every signal it gets, so once every producer passed its waits,
    nothing signals or reads the set again in this launch."""
    p = ctx.plan
    if not p.exit_counters:
        return "", ""
    from fusionc.codegen.stream_layout import CHUNK_STRIDE
    first, n = p.exit_counters
    call = (f"fc_counters_exit(fc_counters + {first}, {n}, {CHUNK_STRIDE}, "
            f"fc_counters + {first + n * CHUNK_STRIDE});")
    waits = [op for ph in p.phases for op in ph.units.regions[0]
             if op.name == "counter_wait" and op.attr("reset") == "exit"]
    att = p.attention is not None and p.attention.attr("wait")   # the consumers' wait
    if all(_is_poll(op) or _once(op) for op in waits) and not att:
        return f"if (fc_lane == 0) {call}", ""
    return "", ("fc_consumer_sync<256>();  // every consumer's last use of the counters is done\n"
                f"if (threadIdx.x == 0) {call}")


def row_rms(op, ctx) -> str:
    """The consumers' prologue for ``row_rms``: every CTA's 1 / rms of each batch row, in
    shared memory (``fc_rms``), after the previous kernel (PDL) finished writing x."""
    from fusionc.codegen.stream_layout import rms_rows
    p = ctx.plan
    x = op.operands[0]
    ct, k = cnames.ctype(x.type.dtype), x.type.shape[1]
    m = cnames.dim(x.type.shape[0])
    ctx.staged.add("pdl_wait")
    return (f"float* const fc_rms = reinterpret_cast<float*>(fc_smem + {p.rms_off});\n"
            "fc_grid_dependency_wait();  // PDL: x from the previous kernel\n"
            f"fc_row_rms<256, {p.max_batch}, {ct}>({ctx.ptr(x)}, {m}, {k}, "
            f"{op.attr('eps')!r}f, fc_rms + {rms_rows(p)}, fc_rms);\n"
            "fc_consumer_sync<256>();\n")


POLL_LOADS = 4   # counters per lane in one chunk poll: 128 units (a CTA's share of a phase)
SLOT_C = {"const": "0", "group": "fc_g", "unit": "fc_u", "step": "fc_s"}   # a counter's slot


def _counter(op, ctx) -> str:
    p = ctx.plan
    first, _, stride = p.counters[op.attr("name")]
    base = SLOT_C[op.attr("slot")]
    return f"fc_counters + {first} + ({base} + {op.attr('index')}) * {stride}"


def _role_sync(op) -> str:
    return "__syncwarp();" if op.attr("warp") == "producer" else "fc_consumer_sync<256>();"


def _leader(op) -> str:
    return "fc_lane == 0" if op.attr("warp") == "producer" else "threadIdx.x == 0"


@emits("counter_signal")
def _signal(op, ctx):
    return f"{_role_sync(op)}\nif ({_leader(op)}) fc_counter_signal({_counter(op, ctx)});"


@emits("counter_wait")
def _cwait(op, ctx):
    from fusionc.codegen.streamed import COUNTER_TIMEOUT_NS
    from fusionc.stream.schedule import wait_target_c
    err = f"fc_counters + {ctx.plan.words - 1}"
    target = wait_target_c(op.attr("target"), op.attr("total"),
                           f"{SLOT_C[op.attr('slot')]} + {op.attr('index')}")
    if _is_poll(op):
        return _poll(op, ctx, err)
    if _once(op):
        return _wait_once(op, ctx, err)
    sub = "true" if op.attr("reset") == "wait" else "false"
    return (f"if ({_leader(op)}) fc_counter_wait<{sub}>({_counter(op, ctx)}, {target}, "
            f"{err}, {COUNTER_TIMEOUT_NS}ull);\n{_role_sync(op)}")


def _wait_once(op, ctx, err) -> str:
    """:func:`_once`'s wait: ``target`` signals per CTA of the launch, at the CTA's first unit
    of the phase (a CTA without units in it skips the wait: it reads nothing)."""
    from fusionc.codegen.streamed import COUNTER_TIMEOUT_NS
    if "bool fc_polled" not in ctx.producer_setup:
        ctx.producer_setup += "bool fc_polled = false;  // acquired since the last proxy fence\n"
    stamp = ctx.stamps.at(f"producer: phase {ctx.phase.index}'s signals acquired",
                          "producer") if ctx.stamps else ""
    return (f"if (fc_i == 0) {{\n  if ({_leader(op)}) fc_counter_wait<false>({_counter(op, ctx)},"
            f" {op.attr('target')}u * gridDim.x, {err}, {COUNTER_TIMEOUT_NS}ull);\n"
            f"  {_role_sync(op)}\n  fc_polled = true;\n{'  ' + stamp if stamp else ''}}}")


def _poll(op, ctx, err) -> str:
    """A producer's wait on the K chunk of each unit (``slot = step``, ``reset = exit``): when
    the unit's chunk is not known ready, the warp's 32 lanes load the counters of the next
    32 · POLL_LOADS units at once (one L2 round trip, not one per unit: a blocked producer
    issues no copies) and keep how many consecutive units are ready (``fc_ready``: units of
    this phase with ``fc_i < fc_ready``)."""
    from fusionc.codegen.streamed import COUNTER_TIMEOUT_NS
    ph = ctx.phase
    first, _, stride = ctx.plan.counters[op.attr("name")]
    if "fc_ready" not in ph.producer_setup:
        ph.producer_setup += "int fc_ready = 0;  // units of this phase whose chunks are ready\n"
        if "bool fc_polled" not in ctx.producer_setup:
            ctx.producer_setup += "bool fc_polled = false;  // acquired since the last proxy fence\n"
    return (f"if (fc_i >= fc_ready) {{\n"
            f"  fc_ready = fc_i + fc_poll_chunks<{POLL_LOADS}>(fc_counters + {first} + "
            f"{op.attr('index')} * {stride}, {stride}, "
            f"fc_u, fc_u1, {ph.group}, {op.attr('target')}, {op.attr('total')}, {err}, "
            f"{COUNTER_TIMEOUT_NS}ull);\n"
            "  fc_polled = true;\n}")
