"""Design v2 lowering of an attention block's core to a kernel of work units (issue 22).

:func:`attention_cores` finds, for each ``decode_attention`` of a graph, the ops between a QKV
projection's output and the attention output, in the form ``fusionc.models.blocks`` writes:

    q, k, v = split(qkv)                     # [H·D, KV·D, KV·D] on the last axis
    q_heads, k_heads, v_heads = reshape(...)  # [B, H, D], [B, KV, D], [B, KV, D]
    (q_heads, k_heads = rms_norm(·, q_norm), rms_norm(·, k_norm))   # QK-norm, optional
    q_rot, k_rot = rope(q_heads, pos), rope(k_heads, pos)           # one rope
    k_cache', v_cache' = kv_cache_append(k_cache, v_cache, k_rot, v_heads, pos)
    o = decode_attention(q_rot, k_cache', v_cache', seq_lens)
    o_flat = reshape(o)                      # [B, H·D], read by the output projection

:func:`lower_core` makes the kernel: one ``attn_units`` op (:mod:`fusionc.ir.ops.tile_attn_units`)
over a grid of one CTA per SM, writing ``o_flat`` and the caches in place. The QKV and output
projections around it are v2 linear kernels (:mod:`fusionc.lower.linear_v2`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fusionc.cost.h200 import H200
from fusionc.ir.nodes import Graph, Op, Value, users
from fusionc.ir.types import DType
from fusionc.ir.ops.tile_attn_units import STEP, fast, unsupported
from fusionc.lower.builder import KernelBuilder

def covers(g: Graph) -> bool:
    """Whether lowering v2 takes every attention of graph ``g``: each ``decode_attention`` is
    the core of a matched block (:func:`attention_cores`) of a geometry the units take at
    speed (:func:`fusionc.ir.ops.tile_attn_units.fast`), f32 (by FMA) and groups of more than
    16 query heads per KV head (by query blocks) included, whose rings fit in shared memory
    (:func:`fusionc.codegen.attn_units.ring_fit`: not f32 at head_dim 192 with 16-head
    blocks)."""
    atts = [op for op in g.body if op.name == "decode_attention"]
    cores = attention_cores(g)
    return len(cores) == len(atts) and all(takes(c) for c in cores)


def takes(c: "AttentionCore") -> bool:
    """Whether the attention units take core ``c`` at speed (:func:`covers`)."""
    from fusionc.codegen.attn_units import ring_fit
    q, kc = c.attention.operands[0].type, c.caches[0].type
    return all(isinstance(x, int) for x in (q.shape[1], *kc.shape[1:])) and \
        not unsupported(q.dtype, q.shape[1], kc.shape[2], kc.shape[3]) and \
        fast(kc.shape[3]) and \
        ring_fit(kc.shape[3], kc.dtype.itemsize, q.shape[1] // kc.shape[2],
                 threads(kc.shape[3], kc.dtype))[0] >= 2


def host_rest(g: Graph) -> list[Op]:
    """The ops of graph ``g`` that are neither a linear nor part of an attention core the units
    take (:func:`takes`) or an MLA core: what the mixed path (``attention-units{host}`` then
    ``lower-library``) runs on the host, the other attentions' ops included."""
    from fusionc.lower.mla_v2 import mla_cores
    cores = [c for c in attention_cores(g) if takes(c)] + mla_cores(g)
    absorbed = {id(o) for c in cores for o in c.absorbed}
    return [op for op in g.body if op.name != "linear" and id(op) not in absorbed]


IN_PLACE = ("kv_cache_append", "kv_cache_write")   # their results are their input caches


def refuse_in_place_reads(g: Graph) -> None:
    """LoweringError naming a ``kv_cache_append`` or ``kv_cache_write`` of host graph ``g``
    whose input caches anything else reads (or the graph returns): the host path writes them
    in place, so such a read would see the new tokens (the interpreter's value semantics would
    not)."""
    from fusionc.errors import LoweringError
    use, outputs = users(g), {v.name for v in g.outputs}
    for op in g.body:
        if op.name not in IN_PLACE:
            continue
        for c in op.operands[:2]:
            if any(u is not op for u in use.get(c.name, [])) or c.name in outputs:
                raise LoweringError(f"the cache %{c.name} is read beside its {op.name}",
                                    op=op.name, loc=op.loc,
                                    valid="caches read only through the append's results "
                                          "(the append is in place)")


def refuse_unmatched(g: Graph, cores) -> None:
    """LoweringError naming a ``decode_attention`` of ``g`` that is no matched core (``cores``:
    ids of the matched attentions), rather than the first op of its block that no kernel took
    (``partition-units`` and ``attention-units`` both ask)."""
    from fusionc.errors import LoweringError
    for op in g.body:
        if op.name == "decode_attention" and id(op) not in cores:
            raise LoweringError(
                "an attention outside the block form the attention units take", op=op.name,
                loc=op.loc, valid="q, k, v = split(linear(...)) -> reshape to heads -> "
                "(rms_norm: QK-norm) -> one rope on q and k -> kv_cache_append(k_cache, "
                "v_cache, k, v, positions) on caches nothing else reads -> "
                "decode_attention(q, appended k, appended v, seq_lens) -> reshape, each value "
                "read once (fusionc.models.blocks); others on the mixed path "
                "(fusionc.runtime.pipelines.mixed_pipeline(rows, host=True))")


def threads(head_dim: int, dtype: DType | None = None) -> int:
    """Threads per CTA: eight warps, four above head_dim 128 or for f32 (two cp.async stages
    per warp of K and V rows must fit in shared memory: fusionc.codegen.attn_units.geometry)."""
    return 256 if head_dim <= 128 and dtype != DType.f32 else 128


@dataclass
class AttentionCore:
    """One matched core: the absorbed ops, its inputs, and the values it makes."""

    attention: Op
    qkv: Value
    caches: tuple[Value, Value]
    positions: Value
    seq_lens: Value
    rope: Op
    norms: tuple = ()          # (q_norm, k_norm) weights, or ()
    eps: float = 1e-6
    out: Value | None = None   # o_flat
    results: tuple = ()        # the updated caches (append's results)
    absorbed: list = field(default_factory=list)


def _producer(g: Graph) -> dict:
    return {r.name: op for op in g.body for r in op.results}


def attention_cores(g: Graph) -> list[AttentionCore]:
    """The attention cores of graph ``g`` (module docstring), in program order; a
    ``decode_attention`` in another form is left out (partition-units then names it)."""
    made, use = _producer(g), users(g)
    outputs = {v.name for v in g.outputs}
    found = []
    for op in g.body:
        if op.name == "decode_attention":
            core = _match(op, made, use, outputs)
            if core is not None:
                found.append(core)
    return found


def _only(v: Value, use, outputs, op_name: str) -> Op | None:
    u = use.get(v.name, [])
    return u[0] if len(u) == 1 and u[0].name == op_name and v.name not in outputs else None


def _match(att: Op, made, use, outputs) -> AttentionCore | None:
    q_rot, kc1, vc1, lens = att.operands
    app = made.get(kc1.name)
    if app is None or app.name != "kv_cache_append" or made.get(vc1.name) is not app or \
            [r.name for r in app.results] != [kc1.name, vc1.name]:   # K, V in order
        return None
    kc, vc, k_rot, v_heads, pos = app.operands
    rq, rk = made.get(q_rot.name), made.get(k_rot.name)
    if rq is None or rk is None or rq.name != "rope" or rk.name != "rope" or \
            rq.attrs != rk.attrs or rq.operands[1].name != pos.name or \
            rk.operands[1].name != pos.name:
        return None
    if kc.name in made or vc.name in made or \
            use.get(kc.name) != [app] or use.get(vc.name) != [app] or \
            _only(q_rot, use, outputs, "decode_attention") is not att or \
            _only(k_rot, use, outputs, "kv_cache_append") is not app or \
            any(u is not att for u in use.get(kc1.name, []) + use.get(vc1.name, [])):
        return None
    absorbed = [rq, rk, app, att]
    qh, kh, norms, eps = rq.operands[0], rk.operands[0], (), 1e-6
    nq, nk = made.get(qh.name), made.get(kh.name)
    if nq is not None and nq.name == "rms_norm" and nk is not None and nk.name == "rms_norm":
        if nq.attr("eps") != nk.attr("eps") or _only(qh, use, outputs, "rope") is not rq or \
                _only(kh, use, outputs, "rope") is not rk:
            return None
        norms, eps = (nq.operands[1], nk.operands[1]), nq.attr("eps")
        absorbed += [nq, nk]
        qh, kh = nq.operands[0], nk.operands[0]
    views = [made.get(v.name) for v in (qh, kh, v_heads)]
    if any(v is None or v.name != "reshape" for v in views):
        return None
    nxt = "rms_norm" if norms else "rope"
    for v, want in ((qh, nxt), (kh, nxt), (v_heads, "kv_cache_append")):
        if _only(v, use, outputs, want) is None:
            return None
    split = made.get(views[0].operands[0].name)
    parts = [vw.operands[0] for vw in views]
    if split is None or split.name != "split" or [r.name for r in split.results] != \
            [p.name for p in parts] or split.attr("axis") not in (1, -1) or \
            any(len(use.get(p.name, [])) != 1 or p.name in outputs for p in parts):
        return None
    bsz, heads, d = q_rot.type.shape
    kvh = kc.type.shape[2]
    if tuple(split.attr("sizes")) != (heads * d, kvh * d, kvh * d):
        return None
    o = att.result
    flat = _only(o, use, outputs, "reshape")
    if flat is None or flat.result.type.shape != (bsz, heads * d):
        return None
    absorbed += views + [split, flat]
    return AttentionCore(att, split.operands[0], (kc, vc), pos, lens, rq, norms, eps,
                         flat.result, app.results, absorbed)


def grid() -> int:
    """CTAs of an attention-units launch: one per SM of the target GPU (shared memory)."""
    return H200.sms


def lower_core(core: AttentionCore, name: str, max_batch: int) -> Graph:
    """The ``attn_units`` kernel of ``core`` (module docstring): units of one CTA each, its
    warps sharing a unit's 16-token steps."""
    rows = core.qkv.type.shape[0]   # a static batch above the bucket sizes the counters
    max_batch = max(max_batch, rows) if isinstance(rows, int) else max_batch
    b = KernelBuilder(name, core.attention.loc)
    emit_units(b, core, grid())
    kc = core.caches[0]
    return b.build(grid=grid(), cluster=1, threads=threads(kc.type.shape[3], kc.type.dtype),
                   max_batch=max_batch)


def emit_units(b: KernelBuilder, core: AttentionCore, ctas: int, signal: str = "",
               wait: str = "", wait_target: int = 0) -> Value:
    """Emit ``core``'s ``attn_units`` op into kernel builder ``b`` over at most ``ctas`` CTAs:
    its parameters (``qkv`` an output of the kernel's QKV phase, if it has one), the caches
    written in place, ``o_flat`` a pure output (returned). ``signal``, ``wait``,
    ``wait_target``: an attention phase of a streamed kernel
    (:func:`fusionc.lower.linear_v2.lower_chain`, :mod:`fusionc.ir.ops.tile_attn_units`)."""
    qkv = next((v for v in b.pure if v.name == core.qkv.name), None) or b.param(core.qkv)
    kc, vc, pos, lens = (b.param(v) for v in (*core.caches, core.positions, core.seq_lens))
    norms = tuple(b.param(v) for v in core.norms)
    o = b.output(core.out, pure=True)
    b.output(kc)
    b.output(vc)
    r = core.rope
    nt = threads(kc.type.shape[3], kc.type.dtype)
    b.op("attn_units", qkv, kc, vc, pos, lens, o, *norms, grid=ctas, tile=STEP * nt // 32,
         scale=core.attention.attr("scale"), theta=r.attr("theta"), style=r.attr("style"),
         rotary_dim=r.attr("rotary_dim"), scaling=r.attr("scaling"), eps=core.eps,
         signal=signal, wait=wait, wait_target=wait_target, loc=core.attention.loc)
    return o
