"""Tile program of a fused attention block: one cluster per KV head (its GQA group of query
heads), C CTAs per cluster (ClusterFusion, arXiv 2508.18850, §4, generalized to GQA, any C).

Per CTA of cluster g (KV head g, query heads g·G ... g·G + G − 1), rank r:
1. RMSNorm + QKV projection, one of two schemes (the cost model picks):
   - ``splitk``: the CTA normalizes its slice of x (sum of squares by ``cluster_reduce``) and
     computes partial q, k, v of the group over its K slice; one ``cluster_reduce`` of the packed
     partials gives every CTA the full q, k, v.
   - ``splitn``: every CTA normalizes all of x (small, from L2) and computes 1/C of the group's
     q, k, v rows over all of K; one ``cluster_gather`` assembles them (C× fewer DSM bytes).
2. QK-norm and RoPE on the reduced head vectors (replicated, tiny); rank 0 appends k, v to the
   KV cache (off-chip).
3. Split-KV attention over the CTA's chunk of the cache, the new token taken from registers;
   merged by ``cluster_reduce(max)`` and one ``cluster_reduce(sum)`` of the rescaled [l, o].
4. Output projection split-N across the cluster (CTA r: 1/C of the hidden rows over this
   group's columns); summed over clusters off-chip by a deterministic ``grid_reduce`` that
   starts from the residual.
"""
from __future__ import annotations

from fusionc.errors import LoweringError
from fusionc.ir.nodes import Graph
from fusionc.lower.builder import KernelBuilder
from fusionc.lower.collectives import all_gather, all_reduce, project_and_sum
from fusionc.lower.match import AttentionStage


def lower_attention(st: AttentionStage, name: str, size: int, scheme: str,
                    max_batch: int, threads: int = 256, kv_tile: int = 16) -> Graph:
    """The kernel for ``st`` with cluster size ``size`` and QKV ``scheme`` (splitk|splitn)."""
    G, D = st.heads // st.kv_heads, st.head_dim
    _check(st, size, scheme)
    b = KernelBuilder(name, st.ops[0].loc)
    for v in (st.x, st.q.weight, st.k.weight, st.v.weight, st.k_cache, st.v_cache, st.seq_lens,
              st.positions):
        b.param(v)
    B = st.x.type.shape[0]
    qkv = _project_splitk(b, st, size) if scheme == "splitk" else _project_splitn(b, st, size)
    pos = b.op("load", st.positions, offsets=["0"], sizes=[B], hint="pos")
    q, k, v = _heads(b, st, qkv, pos)
    with b.when("rank", 0, 1):
        b.op("kv_append", st.k_cache, k, pos, kv_head="cluster")
        b.op("kv_append", st.v_cache, v, pos, kv_head="cluster")
    b.output(st.k_cache)
    b.output(st.v_cache)
    lens = b.op("load", st.seq_lens, offsets=["0"], sizes=[B], hint="lens")
    m, l, o = b.op("attn_partial", q, st.k_cache, st.v_cache, lens, pos, k, v,
                   kv_head="cluster", part="rank", parts=size, tile=kv_tile, scale=st.scale,
                   hint="sm")
    m_max = all_reduce(b, m, "max", hint="mmax") if size > 1 else m
    lo = b.op("attn_rescale", m, l, o, m_max, hint="lo")
    lo = all_reduce(b, lo, "sum", hint="lo_sum") if size > 1 else lo
    o = b.op("cast", b.op("attn_finish", lo, hint="o32"), dtype=str(st.x.type.dtype), hint="o")
    _output(b, st, o, size, G, D)
    return b.build(grid=st.kv_heads, cluster=size, threads=threads, max_batch=max_batch)


def _check(st: AttentionStage, size: int, scheme: str) -> None:
    hidden, G, D = st.x.type.shape[1], st.heads // st.kv_heads, st.head_dim
    need = {"splitk": [("hidden", hidden)], "splitn": [("head_dim", D)]}[scheme]
    if st.o_proj is not None:
        need.append(("output features", st.o_proj.type.shape[0]))
    for what, n in need:
        if n % size:
            raise LoweringError(f"{what} = {n} is not divisible by the cluster size {size}",
                                op="decode_attention", loc=st.ops[0].loc,
                                valid="a cluster size dividing it, e.g. "
                                + ", ".join(str(c) for c in (1, 2, 4, 8, 16) if n % c == 0))
    if G * D * st.kv_heads != st.q.rows:
        raise LoweringError("q projection rows do not match heads x head_dim", op="linear")


def _project_splitk(b: KernelBuilder, st: AttentionStage, size: int):
    """Partial q, k, v over this CTA's K slice, reduced over the cluster: [B, (G+2)·D] f32."""
    B, hidden = st.x.type.shape
    ks = hidden // size
    x = b.op("load", st.x, offsets=["0", f"{ks}*rank"], sizes=[B, ks], hint="x")
    if st.norm is not None:
        ss = b.op("reduce", x, op="sumsq", axis=-1, hint="ss")
        ss = all_reduce(b, ss, "sum", hint="ss_sum") if size > 1 else ss
        w = b.op("load", b.param(st.norm.weight), offsets=[f"{ks}*rank"], sizes=[ks], hint="wn")
        x = b.op("norm_apply", x, w, ss, eps=st.norm.eps, dim=hidden, hint="h",
                 loc=st.norm.loc)
    G, D = st.heads // st.kv_heads, st.head_dim
    parts = [b.op("gemv", x, p.weight, row=f"{p.row0} + {n}*cluster", col=f"{ks}*rank",
                  rows=n, hint="p", loc=p.loc)
             for p, n in ((st.q, G * D), (st.k, D), (st.v, D))]
    pack = b.op("concat", *parts, axis=-1, hint="qkv_part")
    return all_reduce(b, pack, "sum", hint="qkv") if size > 1 else pack


def _project_splitn(b: KernelBuilder, st: AttentionStage, size: int):
    """1/C of the group's q, k, v rows over all of K, gathered: [B, (G+2)·D] f32."""
    B, hidden = st.x.type.shape
    x = b.op("load", st.x, offsets=["0", "0"], sizes=[B, hidden], hint="x")
    if st.norm is not None:
        w = b.op("load", b.param(st.norm.weight), offsets=["0"], sizes=[hidden], hint="wn")
        x = b.op("rms_norm", x, w, eps=st.norm.eps, hint="h", loc=st.norm.loc)
    G, D = st.heads // st.kv_heads, st.head_dim
    rq, rk = G * D // size, D // size
    parts = [b.op("gemv", x, p.weight, row=f"{p.row0} + {n * size}*cluster + {n}*rank",
                  col="0", rows=n, hint="p", loc=p.loc)
             for p, n in ((st.q, rq), (st.k, rk), (st.v, rk))]
    pack = b.op("concat", *parts, axis=-1, hint="qkv_part")
    if size == 1:
        return pack
    g = all_gather(b, pack, axis=1, size=size, hint="qkv_g")  # [B, C·(rq + 2rk)], rank-major
    g = b.op("reshape", g, shape=[B, size, rq + 2 * rk], hint="qkv_r")
    qs, ks, vs = b.op("split", g, axis=2, sizes=[rq, rk, rk], hint="qkv_s")
    flat = [b.op("reshape", t, shape=[B, size * t.type.shape[2]], hint="f") for t in (qs, ks, vs)]
    return b.op("concat", *flat, axis=-1, hint="qkv")


def _heads(b: KernelBuilder, st: AttentionStage, qkv, pos):
    """Round to the model dtype, split into heads, QK-norm, RoPE: q [B, G, D], k, v [B, D]."""
    B = st.x.type.shape[0]
    G, D = st.heads // st.kv_heads, st.head_dim
    qkv = b.op("cast", qkv, dtype=str(st.x.type.dtype), hint="qkv16")
    q, k, v = b.op("split", qkv, axis=-1, sizes=[G * D, D, D], hint="s")
    q = b.op("reshape", q, shape=[B, G, D], hint="q")
    k = b.op("reshape", k, shape=[B, 1, D], hint="k")
    for norm, which in ((st.q_norm, "q"), (st.k_norm, "k")):
        if norm is not None:
            w = b.op("load", b.param(norm.weight), offsets=["0"], sizes=[D], hint="w" + which)
            if which == "q":
                q = b.op("rms_norm", q, w, eps=norm.eps, hint="qn", loc=norm.loc)
            else:
                k = b.op("rms_norm", k, w, eps=norm.eps, hint="kn", loc=norm.loc)
    if st.rope is not None:
        q = b.op("rope", q, pos, **dict(st.rope), hint="qr")
        k = b.op("rope", k, pos, **dict(st.rope), hint="kr")
    return q, b.op("reshape", k, shape=[B, D], hint="k2"), v


def _output(b: KernelBuilder, st: AttentionStage, o, size: int, G: int, D: int) -> None:
    """Output projection + residual through grid_reduce, or store the attention output."""
    B = st.x.type.shape[0]
    out = b.output(st.out, pure=True)
    if st.o_proj is None:
        with b.when("rank", 0, 1):
            b.op("store", out, o, offsets=["0", f"{G}*cluster", "0"])
        return
    flat = b.op("reshape", o, shape=[B, G * D], hint="of")
    project_and_sum(b, flat, st.o_proj, out, st.residual, size, f"{G * D}*cluster")
