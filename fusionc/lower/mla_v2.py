"""Design v2 lowering of a multi-head latent attention (MLA) block's core to a kernel of work
units (issue 27).

:func:`mla_cores` finds, for each ``mla_decode_attention`` of a graph, the ops between the
projections and the latent attention output, in the form of ``examples/deepseek_v2_lite.py``
(DeepSeek-V2, arXiv 2405.04434, appendix C):

    q_heads = reshape(q); q_nope, q_pe = split(q_heads)        # W_UK's kernel reads q_nope
    q_rot = rope(q_pe, positions)
    c, k_pe = split(kv_a); c_kv = rms_norm(c, kv_norm)          # the norm is optional
    k_rot = reshape(rope(reshape(k_pe), positions))
    cache' = latent_cache_append(cache, c_kv, k_rot, positions)
    o_latent = mla_decode_attention(q_latent, q_rot, cache', seq_lens)

:func:`lower_core` makes the kernel: one ``mla_units`` op (:mod:`fusionc.ir.ops.tile_mla_units`)
over a grid of one CTA per SM, writing ``o_latent`` and the cache in place. The projections and
the absorbed W_UK and W_UV (``head_linear``, block-diagonal: :mod:`fusionc.lower.match_heads`)
are v2 linear kernels; a ``head_linear`` of another form runs between the kernels as a batched
cuBLAS GEMM (:func:`host_ops`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fusionc.ir.nodes import Graph, Op, Value, users
from fusionc.ir.ops.tile_mla_units import block_heads, mla_tile, unsupported
from fusionc.lower.attention_v2 import grid
from fusionc.lower.builder import KernelBuilder

THREADS = 256   # eight warps: the templates' S and P·V tiles (fusionc.codegen.mla_units)


@dataclass
class MLACore:
    """One matched core: the absorbed ops, the kernel's inputs and the values it makes."""

    attention: Op
    q: Value            # [B, H·(nope + R)]
    q_latent: Value     # [B, H, L]
    kv_a: Value         # [B, L + R]
    kv_norm: Value | None
    eps: float
    cache: Value
    positions: Value
    seq_lens: Value
    rope: Op
    nope: int
    out: Value          # o_latent
    results: tuple      # the appended cache
    absorbed: list = field(default_factory=list)


def mla_cores(g: Graph) -> list[MLACore]:
    """The MLA cores of graph ``g`` (module docstring), in program order; an attention in
    another form is left out (the lowering passes then name it)."""
    made = {r.name: op for op in g.body for r in op.results}
    use, outputs = users(g), {v.name for v in g.outputs}
    params = {p.name for p in g.params}
    found = []
    for op in g.body:
        if op.name == "mla_decode_attention":
            core = _match(op, made, use, outputs, params)
            if core is not None:
                found.append(core)
    return found


def _one(v: Value, use, outputs, want: Op | None = None) -> Op | None:
    """The only reader of ``v`` (and ``want`` if given), v not a graph output."""
    u = use.get(v.name, [])
    if len(u) != 1 or v.name in outputs or want is not None and u[0] is not want:
        return None
    return u[0]


def _of(made, v: Value, name: str) -> Op | None:
    op = made.get(v.name)
    return op if op is not None and op.name == name else None


def _match(att: Op, made, use, outputs, params) -> MLACore | None:
    ql, q_rot, cache1, lens = att.operands
    app = _of(made, cache1, "latent_cache_append")
    rq = _of(made, q_rot, "rope")
    if app is None or rq is None or _one(q_rot, use, outputs, att) is None:
        return None
    cache, c_kv, k_rot, pos = app.operands
    if cache.name not in params or use.get(cache.name) != [app] or \
            any(u is not att for u in use.get(cache1.name, [])) or \
            rq.operands[1].name != pos.name:
        return None
    q, nope = _query(made, use, outputs, rq)
    kv = _latent(made, use, outputs, c_kv, k_rot, rq, pos)
    if q is None or kv is None:
        return None
    kv_a, kv_norm, eps, kops = kv
    return MLACore(att, q, ql, kv_a, kv_norm, eps, cache, pos, lens, rq, nope, att.result,
                   app.results, [rq, app, att] + kops)


def _query(made, use, outputs, rq: Op):
    """(q, nope) with q_pe = split(reshape(q))[1]; the kernel reads q_pe from q itself."""
    q_pe = rq.operands[0]
    sp = _of(made, q_pe, "split")
    if sp is None or _one(q_pe, use, outputs, rq) is None or len(sp.results) != 2 or \
            sp.results[1].name != q_pe.name or sp.attr("axis") not in (2, -1):
        return None, 0
    rs = _of(made, sp.operands[0], "reshape")
    if rs is None or rs.operands[0].type.rank != 2 or rs.result.type.rank != 3:
        return None, 0
    return rs.operands[0], int(sp.attr("sizes")[0])


def _latent(made, use, outputs, c_kv: Value, k_rot: Value, rq: Op, pos: Value):
    """(kv_a, kv_norm, eps, absorbed ops) with c_kv = [rms_norm](split(kv_a)[0]) and
    k_rot = reshape(rope(reshape(split(kv_a)[1]))), the rope as q's."""
    ops, kv_norm, eps, c = [], None, 1e-6, c_kv
    n = _of(made, c_kv, "rms_norm")
    if n is not None:
        if _one(c_kv, use, outputs) is None or n.operands[1].name in made:
            return None   # the norm weight: a graph input
        kv_norm, eps, c = n.operands[1], n.attr("eps"), n.operands[0]
        ops.append(n)
    r1 = _of(made, k_rot, "reshape")
    rk = _of(made, r1.operands[0], "rope") if r1 is not None else None
    r0 = _of(made, rk.operands[0], "reshape") if rk is not None else None
    if r0 is None or rk.attrs != rq.attrs or rk.operands[1].name != pos.name or \
            any(_one(v, use, outputs) is None for v in (k_rot, r1.operands[0], r0.result)):
        return None
    sp = _of(made, c, "split")
    k_pe = r0.operands[0]
    if sp is None or [r.name for r in sp.results] != [c.name, k_pe.name] or \
            sp.attr("axis") not in (1, -1) or sp.operands[0].type.rank != 2 or \
            any(_one(v, use, outputs) is None for v in (c, k_pe)):
        return None
    return sp.operands[0], kv_norm, eps, ops + [r1, rk, r0, sp]


def covers(g: Graph) -> bool:
    """Whether lowering v2 takes every MLA attention of graph ``g``: each is the core of a
    matched block of a geometry the units take."""
    atts = [op for op in g.body if op.name == "mla_decode_attention"]
    cores = mla_cores(g)
    return len(cores) == len(atts) and not any(_bad(c) for c in cores)


def _bad(core: MLACore) -> list[str]:
    ql, cache = core.q_latent.type, core.cache.type
    return unsupported(ql.dtype, ql.shape[1], ql.shape[2], cache.shape[2] - ql.shape[2])


def host_ops(g: Graph) -> list[Op]:
    """The ops the MLA path runs between the kernels: each ``head_linear`` (W_UK, W_UV) that
    no block-diagonal kernel takes (:mod:`fusionc.lower.match_heads`) and the views
    (``reshape``, ``split``) between it and the kernels that make or read its operands and
    result."""
    from fusionc.lower.match_heads import head_kernels
    made = {r.name: op for op in g.body for r in op.results}
    use = users(g)
    found: dict[int, Op] = {}
    taken = head_kernels(g)
    for op in g.body:
        if op.name != "head_linear" or id(op) in taken:
            continue
        found[id(op)] = op
        todo = [made.get(op.operands[0].name)]
        while todo:   # back through the views to the projection
            v = todo.pop()
            if v is not None and v.name in ("reshape", "split") and id(v) not in found:
                found[id(v)] = v
                todo.append(made.get(v.operands[0].name))
        nxt = list(use.get(op.result.name, []))
        while nxt:    # on through the views to the next kernel
            v = nxt.pop()
            if v.name == "reshape" and id(v) not in found:
                found[id(v)] = v
                nxt += use.get(v.result.name, [])
    return [op for op in g.body if id(op) in found]


def refuse_unmatched(g: Graph, cores) -> None:
    """LoweringError naming an ``mla_decode_attention`` of ``g`` that is no matched core or
    whose geometry the units do not take (``cores``: ids of the matched attentions)."""
    from fusionc.errors import LoweringError
    by_id = {id(c.attention): c for c in mla_cores(g)}
    for op in g.body:
        if op.name != "mla_decode_attention":
            continue
        if id(op) not in cores:
            raise LoweringError(
                "an MLA attention outside the block form the MLA units take", op=op.name,
                loc=op.loc, valid="q_pe = split(reshape(q))[1] -> rope; c, k_pe = "
                "split(kv_a) -> (rms_norm c) and reshape-rope-reshape k_pe -> "
                "latent_cache_append on a cache nothing else reads -> "
                "mla_decode_attention(q_latent, q_rot, cache', seq_lens) "
                "(examples/deepseek_v2_lite.py)")
        bad = _bad(by_id[id(op)])
        if bad:
            raise LoweringError("the MLA units cannot take " + ", ".join(bad), op=op.name,
                                loc=op.loc, valid="f16, bf16 or f32, at most 128 heads, a "
                                "latent dim a multiple of 64 and a rope dim a multiple of 16")


def lower_core(core: MLACore, name: str, max_batch: int) -> Graph:
    """The ``mla_units`` kernel of ``core`` (module docstring)."""
    rows = core.q.type.shape[0]   # a static batch above the bucket sizes the counters
    max_batch = max(max_batch, rows) if isinstance(rows, int) else max_batch
    b = KernelBuilder(name, core.attention.loc)
    ins = [b.param(v) for v in (core.q, core.q_latent, core.kv_a, core.cache,
                                core.positions, core.seq_lens)]
    norm = [b.param(core.kv_norm)] if core.kv_norm is not None else []
    o = b.output(core.out, pure=True)
    b.output(ins[3])
    r = core.rope
    b.op("mla_units", *ins, o, *norm, grid=grid(), scale=core.attention.attr("scale"),
         theta=r.attr("theta"), style=r.attr("style"), rotary_dim=r.attr("rotary_dim"),
         scaling=r.attr("scaling"), eps=core.eps, nope=core.nope, tile=mla_tile(max_batch),
         block=block_heads(core.q_latent.type.shape[1], core.q.type.dtype, max_batch),
         loc=core.attention.loc)
    return b.build(grid=grid(), cluster=1, threads=THREADS, max_batch=max_batch)
