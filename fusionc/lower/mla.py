"""Tile program of a fused MLA attention block (DeepSeek-V2, arXiv 2405.04434, appendix C, the
weight-absorbed decode form), one cluster per group of ``group`` heads, C CTAs per cluster
(ClusterFusion, arXiv 2508.18850, §4: one cluster per head; a group of heads shares each cache
tile, so the latent cache is read once per cluster rather than once per head).

Per CTA of cluster g (heads g·G ... g·G + G − 1), rank r:
1. RMSNorm of all of x (replicated); 1/C of the group's query rows (G·(nope + rope)) and 1/C of
   the latent + RoPE-key rows of ``w_kv_a`` over all of K; one ``cluster_gather`` gives every
   CTA the group's queries and the new token's [c ; k_rope] (every cluster computes the latter:
   it is shared by all heads and small).
2. Latent RMSNorm, RoPE on q_rope and k_rope (replicated, tiny); cluster 0, rank 0 appends
   [c ; k_rope] to the latent cache (off-chip).
3. Absorbed query q̃_h = W_UK_hᵀ q_nope_h: CTA r computes latent rows [r·L/C, (r+1)·L/C) of each
   head of the group; one ``cluster_gather`` builds the whole latent query in every CTA.
4. Split-KV attention over the CTA's chunk of the latent cache (``mla_attn_partial``: all G
   heads per staged row), merged by ``cluster_reduce(max)`` and ``cluster_reduce(sum)``.
5. W_UV: CTA r computes v_head/C rows of each head's output; one ``cluster_gather``; the output
   projection split-N across the cluster over the group's columns, summed over clusters by the
   deterministic ``grid_reduce`` that starts from the residual.
"""
from __future__ import annotations

from fusionc.errors import LoweringError
from fusionc.ir.nodes import Graph, Value
from fusionc.lower.builder import KernelBuilder
from fusionc.lower.collectives import all_gather, all_reduce, project_and_sum
from fusionc.lower.match_mla import MLAStage


def lower_mla(st: MLAStage, name: str, size: int, group: int, max_batch: int,
              threads: int = 256, kv_tile: int = 16) -> Graph:
    """The kernel for ``st``: ``heads / group`` clusters of ``size`` CTAs."""
    _check(st, size, group)
    b = KernelBuilder(name, st.ops[0].loc)
    for v in (st.x, st.q.weight, st.c.weight, st.cache, st.seq_lens, st.positions):
        b.param(v)
    B = st.x.type.shape[0]
    dt = str(st.x.type.dtype)
    q, kv = _project(b, st, size, group)
    pos = b.op("load", st.positions, offsets=["0"], sizes=[B], hint="pos")
    q_nope, q_rope, new = _heads_and_latent(b, st, q, kv, pos, group)
    with b.when("cluster", 0, 1):
        with b.when("rank", 0, 1):
            b.op("kv_append", st.cache, new, pos, kv_head="0")
    b.output(st.cache)
    heads = [_head(b, q_nope, j, group) for j in range(group)]
    q_lat = _per_head(b, heads, b.param(st.w_uk), st.latent, size, group, dt, "ql")
    q_full = b.op("concat", q_lat, q_rope, axis=2, hint="q_full")
    lens = b.op("load", st.seq_lens, offsets=["0"], sizes=[B], hint="lens")
    m, l, o = b.op("mla_attn_partial", q_full, st.cache, lens, pos, new, part="rank",
                   parts=size, tile=kv_tile, scale=st.scale, latent=st.latent, hint="sm")
    m_max = all_reduce(b, m, "max", hint="mmax") if size > 1 else m
    lo = b.op("attn_rescale", m, l, o, m_max, hint="lo")
    lo = all_reduce(b, lo, "sum", hint="lo_sum") if size > 1 else lo
    o = b.op("cast", b.op("attn_finish", lo, hint="o32"), dtype=dt, hint="o_lat")
    outs = [_head(b, o, j, group) for j in range(group)]
    o = _per_head(b, outs, b.param(st.w_uv), st.v_head, size, group, dt, "ov")
    flat = b.op("reshape", o, shape=[B, group * st.v_head], hint="o_flat")
    project_and_sum(b, flat, st.o_proj, b.output(st.out, pure=True), st.residual, size,
                    f"{group * st.v_head}*cluster")
    return b.build(grid=st.heads // group, cluster=size, threads=threads, max_batch=max_batch)


def _check(st: MLAStage, size: int, group: int) -> None:
    qw = st.nope + st.rope_dim
    need = [("heads", st.heads, group, "heads per cluster"),
            ("query rows per cluster", group * qw, size, "cluster size"),
            ("latent + rope", st.latent + st.rope_dim, size, "cluster size"),
            ("latent", st.latent, size, "cluster size"), ("v_head", st.v_head, size,
                                                           "cluster size"),
            ("output features", st.o_proj.type.shape[0], size, "cluster size")]
    for what, n, d, by in need:
        if n % d:
            raise LoweringError(f"{what} = {n} is not divisible by the {by} {d}",
                                op="mla_decode_attention", loc=st.ops[0].loc,
                                valid=f"a {by} dividing {n}")
    if st.k_rope.row0 != st.c.row0 + st.latent:
        raise LoweringError("the RoPE key rows do not follow the latent rows in w_kv_a",
                            op="linear", loc=st.c.loc, valid="split(linear(h, w_kv_a), "
                            "[latent, rope]) with the latent first")


def _project(b: KernelBuilder, st: MLAStage, size: int, group: int) -> tuple[Value, Value]:
    """1/C of the group's query rows and of the latent + RoPE-key rows over all of K, gathered:
    q [B, G·(nope + rope)], kv [B, latent + rope], fp32."""
    B, hidden = st.x.type.shape
    x = b.op("load", st.x, offsets=["0", "0"], sizes=[B, hidden], hint="x")
    if st.norm is not None:
        w = b.op("load", b.param(st.norm.weight), offsets=["0"], sizes=[hidden], hint="wn")
        x = b.op("rms_norm", x, w, eps=st.norm.eps, hint="h", loc=st.norm.loc)
    qw = group * (st.nope + st.rope_dim)
    rq, rk = qw // size, (st.latent + st.rope_dim) // size
    pq = b.op("gemv", x, st.q.weight, row=f"{st.q.row0} + {qw}*cluster + {rq}*rank", col="0",
              rows=rq, hint="pq", loc=st.q.loc)
    pk = b.op("gemv", x, st.c.weight, row=f"{st.c.row0} + {rk}*rank", col="0", rows=rk,
              hint="pk", loc=st.c.loc)
    if size == 1:
        return pq, pk
    g = all_gather(b, b.op("concat", pq, pk, axis=-1, hint="qk_part"), axis=1, size=size,
                   hint="qk_g")
    g = b.op("reshape", g, shape=[B, size, rq + rk], hint="qk_r")
    qs, ks = b.op("split", g, axis=2, sizes=[rq, rk], hint="qk_s")
    return (b.op("reshape", qs, shape=[B, qw], hint="q"),
            b.op("reshape", ks, shape=[B, rk * size], hint="kv"))


def _heads_and_latent(b: KernelBuilder, st: MLAStage, q: Value, kv: Value, pos: Value,
                      group: int):
    """Round to the model dtype; q_nope [B, G, nope], rotated q_rope [B, G, rope] and the new
    cache row [c ; k_rope] [B, latent + rope] (latent normalized, key rotated)."""
    B, dt = st.x.type.shape[0], str(st.x.type.dtype)
    q = b.op("reshape", b.op("cast", q, dtype=dt, hint="q16"),
             shape=[B, group, st.nope + st.rope_dim], hint="qh")
    q_nope, q_rope = b.op("split", q, axis=2, sizes=[st.nope, st.rope_dim], hint="qs")
    c, kr = b.op("split", b.op("cast", kv, dtype=dt, hint="kv16"), axis=-1,
                 sizes=[st.latent, st.rope_dim], hint="kvs")
    if st.kv_norm is not None:
        w = b.op("load", b.param(st.kv_norm.weight), offsets=["0"], sizes=[st.latent],
                 hint="wkv")
        c = b.op("rms_norm", c, w, eps=st.kv_norm.eps, hint="c", loc=st.kv_norm.loc)
    if st.rope is not None:
        q_rope = b.op("rope", q_rope, pos, **dict(st.rope), hint="qr")
        kr = b.op("reshape", b.op("rope", b.op("reshape", kr, shape=[B, 1, st.rope_dim],
                                              hint="kr3"), pos, **dict(st.rope), hint="krr"),
                  shape=[B, st.rope_dim], hint="kr")
    return q_nope, q_rope, b.op("concat", c, kr, axis=-1, hint="new")


def _head(b: KernelBuilder, t: Value, j: int, group: int) -> Value:
    """Head j of a [B, G, D] tile as [B, D]."""
    B, _, d = t.type.shape
    if group > 1:
        t = b.op("split", t, axis=1, sizes=[1] * group, hint="hd")[j]
    return b.op("reshape", t, shape=[B, d], hint="h2")


def _per_head(b: KernelBuilder, xs: list[Value], w: Value, n: int, size: int, group: int,
              dt: str, hint: str) -> Value:
    """y[:, j] = w[head j] · xs[j] for the group's heads, rows split over the cluster (CTA r:
    rows [r·n/C, (r+1)·n/C) of every head) and gathered: [B, G, n] in dtype ``dt``."""
    B, nc = xs[0].type.shape[0], n // size
    parts = [b.op("gemv", x, w, row=f"{n * group}*cluster + {n * j} + {nc}*rank", col="0",
                  rows=nc, hint=hint + "p") for j, x in enumerate(xs)]
    y = b.op("cast", parts[0] if group == 1 else b.op("concat", *parts, axis=-1, hint=hint),
             dtype=dt, hint=hint + "16")
    if size > 1:   # [B, C·G·nc] rank-major → [B, G, n]
        y = b.op("reshape", all_gather(b, y, axis=1, size=size, hint=hint + "_g"),
                 shape=[B, size, group, nc], hint=hint + "_r")
        heads = b.op("split", y, axis=2, sizes=[1] * group, hint=hint + "_s") \
            if group > 1 else (y,)
        y = b.op("concat", *[b.op("reshape", h, shape=[B, 1, n], hint=hint + "_h")
                             for h in heads], axis=1, hint=hint + "_c") \
            if group > 1 else b.op("reshape", heads[0], shape=[B, 1, n], hint=hint + "_h")
    return b.op("reshape", y, shape=[B, group, n], hint=hint + "_3")
