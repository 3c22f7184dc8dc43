"""Tile program of a fused MLA attention block (DeepSeek-V2, arXiv 2405.04434, appendix C, the
weight-absorbed decode form): one persistent kernel of ``grid`` clusters of C CTAs in five
phases separated by ``grid_barrier`` (the whole grid is resident at once).

The latent cache is shared by all heads, so the attention is split over the cache (every row
read once, all heads per staged row, as FlashMLA); the two big projections (w_q, w_o) are split
over every CTA of the grid; the per-head maps (W_UK absorbed into the query, W_UV) run on a
cluster per group of G heads (ClusterFusion, arXiv 2508.18850, §4: ClusterGather of the
per-CTA slices). The phases meet through small global workspaces (kernel outputs the graph does
not use); T = grid · C CTAs, unit u = C · cluster + rank:

1. All CTAs: RMSNorm of x (replicated); rows [u·r, (u+1)·r) of w_q and of w_kv_a (r = ceil(rows
   / T), masked tails), raw fp32 to ``ws_qr`` and ``ws_kv``.
2. Head clusters g < heads / G: the group's query from ``ws_qr`` rounded to the model dtype,
   RoPE on q_rope, the absorbed query q̃_h = W_UK_hᵀ q_nope_h (CTA r: latent rows
   [r·L/C, (r+1)·L/C) of each head, one ``cluster_gather``); rank 0 stores [q̃ ; q_rope] to
   ``ws_q``. One CTA (of a cluster without heads when there is one) builds the new cache row
   [RMSNorm(c) ; RoPE(k_rope)], appends it and keeps it in ``ws_new``.
3. All CTAs: split-KV attention of unit u (``mla_attn_unit``: row b, part p of the run-time
   batch, all heads at once); the partial (m, l, o) to ``ws_m``, ``ws_l``, ``ws_o``.
4. Head clusters: the partials of the group's latent columns [r·L/C, (r+1)·L/C) merged
   (``attn_merge``), one ``cluster_gather``; W_UV with v_head/C rows per CTA, gathered; rank 0
   stores the heads' outputs to ``ws_ov``.
5. All CTAs: rows [u·r, (u+1)·r) of the output projection over all of ``ws_ov``, plus the
   residual, rounded once and stored (each output element written by one CTA).
"""
from __future__ import annotations

from fusionc.errors import LoweringError
from fusionc.ir.nodes import Graph, Value
from fusionc.ir.types import DType, TensorType
from fusionc.lower.builder import KernelBuilder
from fusionc.lower.collectives import all_gather
from fusionc.lower.match_mla import MLAStage

V1_MAX_HEADS = 16   # every attention work unit computes all heads in one CTA
V1_TESTED_ROWS = 16  # the largest batch its GPU tests and benchmarks ran (2026-12-01)
V1_F32_ROWS = 8      # f32: GPU-tested at 3 rows; from 16 its grid barrier finds no configuration


def lower_mla(st: MLAStage, name: str, size: int, group: int, max_batch: int,
              grid: int = 0, threads: int = 256, kv_tile: int = 16) -> Graph:
    """The kernel for ``st``: ``grid`` clusters of ``size`` CTAs (0: ``heads / group``)."""
    ncl = st.heads // group if st.heads % group == 0 else 0
    _check(st, size, group, max_batch, max(grid, ncl) * size, grid)
    grid = max(grid, ncl)
    units = grid * size
    b = KernelBuilder(name, st.ops[0].loc)
    for v in (st.x, st.q.weight, st.c.weight, st.cache, st.seq_lens, st.positions):
        b.param(v)
    B, width = st.x.type.shape[0], st.latent + st.rope_dim
    dt, qw = st.x.type.dtype, st.nope + st.rope_dim
    ws = {n: b.output(Value(f"{name}_ws_{n}", t), pure=True) for n, t in (
        ("qr", TensorType(DType.f32, (B, st.heads * qw))),
        ("kv", TensorType(DType.f32, (B, width))),
        ("q", TensorType(dt, (B, st.heads, width))),
        ("m", TensorType(DType.f32, (units, st.heads))),
        ("l", TensorType(DType.f32, (units, st.heads))),
        ("o", TensorType(DType.f32, (units, st.heads, st.latent))),
        ("ov", TensorType(dt, (B, st.heads * st.v_head))),
        ("new", TensorType(dt, (B, width))))}
    unit = f"{size}*cluster + rank"
    pos = b.op("load", st.positions, offsets=["0"], sizes=[B], hint="pos")
    h = _normed_x(b, st)                                   # phase 1
    for rows, w, dst in ((st.q, st.q.weight, "qr"), (st.c, st.c.weight, "kv")):
        n = st.heads * qw if dst == "qr" else width
        _rows_to(b, h, w, rows.row0, n, size, units, ws[dst], rows.loc)
    b.op("grid_barrier")
    with b.when("cluster", 0, ncl):                        # phase 2
        q_nope, q_rope = _query(b, st, ws["qr"], pos, group)
        q_lat = _per_head(b, [_head(b, q_nope, j, group) for j in range(group)],
                          b.param(st.w_uk), st.latent, size, group, str(dt), "ql")
        with b.when("rank", 0, 1):
            b.op("store", ws["q"], b.op("concat", q_lat, q_rope, axis=2, hint="q_full"),
                 offsets=["0", f"{group}*cluster", "0"])
    extra = ncl if grid > ncl else 0     # a cluster without heads, else the first
    with b.when("cluster", extra, extra + 1):
        with b.when("rank", 0, 1):   # the new cache row, once: appended and kept for phase 3
            new = _new_row(b, st, b.op("load", ws["kv"], offsets=["0", "0"], sizes=[B, width],
                                       hint="kv"), pos)
            b.op("kv_append", st.cache, new, pos, kv_head="0")
            b.op("store", ws["new"], new, offsets=["0", "0"])
    b.output(st.cache)
    b.op("grid_barrier")
    new = b.op("load", ws["new"], offsets=["0", "0"], sizes=[B, width], hint="new")  # phase 3
    lens = b.op("load", st.seq_lens, offsets=["0"], sizes=[B], hint="lens")
    m, l, o = b.op("mla_attn_unit", ws["q"], st.cache, lens, pos, new, unit=unit, units=units,
                   tile=kv_tile, scale=st.scale, latent=st.latent, hint="sm")
    for t, n in ((m, "m"), (l, "l")):
        b.op("store", ws[n], t, offsets=[unit, "0"])
    b.op("store", ws["o"], o, offsets=[unit, "0", "0"])
    b.op("grid_barrier")
    with b.when("cluster", 0, ncl):                        # phase 4
        _heads_out(b, st, ws, lens, size, group, units)
    b.op("grid_barrier")
    _project_out(b, st, ws["ov"], size, units)             # phase 5
    return b.build(grid=grid, cluster=size, threads=threads, max_batch=max_batch)


def _rows_to(b: KernelBuilder, x: Value, w: Value, row0: int, n: int, size: int, units: int,
             dst: Value, loc) -> None:
    """Rows [u·r, (u+1)·r) of the n rows of ``w`` from ``row0``, times x, fp32, stored to
    ``dst`` (r = ceil(n / units); rows past n masked, never read)."""
    r = -(-n // units)
    tail = r * units > n
    y = b.op("gemv", x, w, row=f"{row0} + {r * size}*cluster + {r}*rank", col="0", rows=r,
             masked=tail, hint="p", loc=loc)
    b.op("store", dst, y, offsets=["0", f"{r * size}*cluster + {r}*rank"], masked=tail)


def _check(st: MLAStage, size: int, group: int, max_batch: int, units: int,
           grid: int) -> None:
    need = [("heads", st.heads, group, "heads per cluster"),
            ("latent", st.latent, size, "cluster size"),
            ("v_head", st.v_head, size, "cluster size")]
    for what, n, d, by in need:
        if n % d:
            raise LoweringError(f"{what} = {n} is not divisible by the {by} {d}",
                                op="mla_decode_attention", loc=st.ops[0].loc,
                                valid=f"a {by} dividing {n}")
    batch = st.x.type.shape[0]
    if isinstance(batch, int):
        max_batch = batch
    if max_batch > units:
        raise LoweringError(f"{max_batch} rows over {units} CTAs (one work unit each)",
                            op="mla_decode_attention", loc=st.ops[0].loc,
                            valid=f"at most clusters x cluster size = {units} rows (max_batch, "
                                  "or the graph's static batch)")
    if st.heads > V1_MAX_HEADS:
        raise LoweringError(f"{st.heads} heads", op="mla_decode_attention", loc=st.ops[0].loc,
                            valid=f"at most {V1_MAX_HEADS} heads: every attention work unit computes all "
                                  "heads in one CTA")
    if 0 < grid < st.heads // group:
        raise LoweringError(f"grid = {grid} clusters for {st.heads // group} head groups",
                            op="mla_decode_attention", loc=st.ops[0].loc,
                            valid=f"grid >= heads / group = {st.heads // group}")
    if st.k_rope.row0 != st.c.row0 + st.latent:
        raise LoweringError("the RoPE key rows do not follow the latent rows in w_kv_a",
                            op="linear", loc=st.c.loc, valid="split(linear(h, w_kv_a), "
                            "[latent, rope]) with the latent first")


def _normed_x(b: KernelBuilder, st: MLAStage) -> Value:
    """RMSNorm of all of x (replicated in every CTA): [B, hidden]."""
    B, hidden = st.x.type.shape
    x = b.op("load", st.x, offsets=["0", "0"], sizes=[B, hidden], hint="x")
    if st.norm is None:
        return x
    w = b.op("load", b.param(st.norm.weight), offsets=["0"], sizes=[hidden], hint="wn")
    return b.op("rms_norm", x, w, eps=st.norm.eps, hint="h", loc=st.norm.loc)


def _query(b: KernelBuilder, st: MLAStage, qr: Value, pos: Value, group: int):
    """The group's query rows from the fp32 workspace, rounded to the model dtype:
    q_nope [B, G, nope] and the rotated q_rope [B, G, rope]."""
    B, dt = st.x.type.shape[0], str(st.x.type.dtype)
    qw = st.nope + st.rope_dim
    q = b.op("load", qr, offsets=["0", f"{group * qw}*cluster"], sizes=[B, group * qw],
             hint="qg")
    q = b.op("reshape", b.op("cast", q, dtype=dt, hint="q16"), shape=[B, group, qw], hint="qh")
    q_nope, q_rope = b.op("split", q, axis=2, sizes=[st.nope, st.rope_dim], hint="qs")
    if st.rope is not None:
        q_rope = b.op("rope", q_rope, pos, **dict(st.rope), hint="qr")
    return q_nope, q_rope


def _heads_out(b: KernelBuilder, st: MLAStage, ws: dict, lens: Value, size: int, group: int,
               units: int) -> None:
    """Phase 4: merge the partials of this group's latent slice, gather, W_UV, store."""
    B, dt = st.x.type.shape[0], str(st.x.type.dtype)
    lc = st.latent // size
    heads = f"{group}*cluster"
    part = [b.op("load", ws[n], offsets=["0", heads], sizes=[units, group], hint=n + "p")
            for n in ("m", "l")]
    op_ = b.op("load", ws["o"], offsets=["0", heads, f"{lc}*rank"], sizes=[units, group, lc],
               hint="op")
    ol = b.op("cast", b.op("attn_merge", *part, op_, lens, hint="om"), dtype=dt, hint="om16")
    if size > 1:
        ol = all_gather(b, ol, axis=2, size=size, hint="ol_g")
    outs = [_head(b, ol, j, group) for j in range(group)]
    o = _per_head(b, outs, b.param(st.w_uv), st.v_head, size, group, dt, "ov")
    with b.when("rank", 0, 1):
        b.op("store", ws["ov"], b.op("reshape", o, shape=[B, group * st.v_head], hint="o_flat"),
             offsets=["0", f"{group * st.v_head}*cluster"])


def _project_out(b: KernelBuilder, st: MLAStage, ov: Value, size: int, units: int) -> None:
    """Phase 5: rows [u·r, (u+1)·r) of the output projection over all heads, plus the
    residual (fp32), rounded once and stored."""
    B = st.x.type.shape[0]
    n = st.o_proj.type.shape[0]
    r = -(-n // units)
    tail = r * units > n
    at = f"{r * size}*cluster + {r}*rank"
    x = b.op("load", ov, offsets=["0", "0"], sizes=[B, ov.type.shape[1]], hint="ovx")
    y = b.op("gemv", x, b.param(st.o_proj), row=at, col="0", rows=r, masked=tail, hint="y")
    if st.residual is not None:
        res = b.op("load", b.param(st.residual), offsets=["0", at], sizes=[B, r], masked=tail,
                   hint="res")
        y = b.op("add", y, b.op("cast", res, dtype="f32", hint="res32"), hint="y_res")
    b.op("store", b.output(st.out, pure=True), y, offsets=["0", at], masked=tail)


def _new_row(b: KernelBuilder, st: MLAStage, kv: Value, pos: Value) -> Value:
    """The appended cache row [RMSNorm(c) ; RoPE(k_rope)] [B, latent + rope] in the model
    dtype, from the raw fp32 projection ``kv``."""
    B, dt = st.x.type.shape[0], str(st.x.type.dtype)
    c, kr = b.op("split", b.op("cast", kv, dtype=dt, hint="kv16"), axis=-1,
                 sizes=[st.latent, st.rope_dim], hint="kvs")
    if st.kv_norm is not None:
        w = b.op("load", b.param(st.kv_norm.weight), offsets=["0"], sizes=[st.latent],
                 hint="wkv")
        c = b.op("rms_norm", c, w, eps=st.kv_norm.eps, hint="c", loc=st.kv_norm.loc)
    if st.rope is not None:
        kr = b.op("reshape", b.op("rope", b.op("reshape", kr, shape=[B, 1, st.rope_dim],
                                              hint="kr3"), pos, **dict(st.rope), hint="krr"),
                  shape=[B, st.rope_dim], hint="kr")
    return b.op("concat", c, kr, axis=-1, hint="new")


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
