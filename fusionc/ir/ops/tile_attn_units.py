"""Tile IR (design v2): the decode-attention core of an attention block as work units over every
SM, whatever the head counts (issue 22).

``attn_units(%qkv, %k_cache, %v_cache, %positions, %seq_lens, %o, %q_norm?, %k_norm?)
{grid, scale, theta, style, rotary_dim, scaling, eps, tile}``
    ``qkv: [B, (H + 2·KV)·D]`` is a QKV projection's output (q heads, then k, then v);
    ``caches [B, S, KV, D]``; ``o: [B, H·D]`` is written. For every batch row b and KV head h
    it computes, as the graph ops ``split``, ``reshape``, (``rms_norm`` over head_dim with
    ``q_norm``/``k_norm``: Qwen3's QK-norm), ``rope`` (``theta``, ``style``, ``rotary_dim``,
    ``scaling``: :mod:`fusionc.ir.ops.rope`), ``kv_cache_append`` and ``decode_attention``
    (``scale``) do, each result rounded to the qkv dtype as the graph rounds it:

    - the new token's k (normed, rotated) and v go to ``cache[b, positions[b], h]``
      (positions outside [0, S) are skipped, never a fault);
    - o for the group's G = H / KV query heads over the n = clamp(seq_lens[b], 0, S) first
      tokens (the token at positions[b] read as just appended); a row with n = 0 gives 0. The
      probabilities are rounded to the qkv dtype before P·V (tensor-core operands, as in
      FlashAttention-2) while l sums them in fp32: ~1e-3 relative from decode_attention.

    **Work units** (:func:`split_plan`, computed on the device from ``seq_lens`` by every CTA,
    never by the host): each (b, h) is cut into ``splits[b]`` equal chunks of L_b tokens, L_b a
    multiple of ``tile``, so that the units number about the ``grid`` CTAs: unit (b, c, h),
    numbered in that order (a chunk's KV heads side by side), takes tokens
    [c·L_b, min(n, (c+1)·L_b)). A group of more than 16 query heads is cut into blocks of
    16 (:func:`q_blocks`): unit (b, c, h, qb) takes block qb's heads, the blocks of a chunk
    and head side by side (their K/V reads meet in L2), and (b, c, h) counts as (b, c, h, qb)
    in what follows. CTA i takes units i, i + grid, ...; its warps share each
    unit's 16-token steps. The chunk 0 unit of (b, h) (block 0) does the append. A unit's partial
    (m, l, o) (online softmax, Milakov & Gimelshein 2018; split-KV as Flash-Decoding, Dao et
    al. 2023) goes to a global slot, then (release) the unit counts itself on the (b, h)
    arrival counter; the unit that counts last (acquire) merges the slots in chunk order, so
    the result does not depend on the order units finish in, and sets the counter back to zero
    (CUDA-graph replays need no host reset): the split-K "last CTA reduces" of the CUDA
    threadFenceReduction sample. One chunk: written directly. Nothing waits (the launch still
    takes at most the resident CTAs: a persistent grid). ``grid`` is the most CTAs (the slots
    are sized for it); a launch holds min(grid, the CTAs resident at once) and strides by its
    own CTA count. The merging CTA reads all of a row's slots (splits · G · (D + 2) floats:
    528 KB at G·D = 2048 and 64 chunks), measured 1.8× slower than merge items spread over the
    CTAs at such rows (BENCHMARKS.md, issue 22 step 3).

    **An attention phase** (``signal = NAME``): the op may also stand at the top level of a
    streamed kernel (:mod:`fusionc.ir.ops.tile_units`), before its ``units`` regions, run by
    the consumer warps while the producer warp already streams the next phase's weights
    (the output projection's). Its CTAs are then the launch's (``grid`` is the most), and once
    a CTA's units are done it releases (GPU scope) and adds 1 to counter ``NAME[0]``: the next
    phase waits for one signal per CTA (``counter_wait {scale = grid}``) before it reads ``o``.
    Between two ``units`` regions, after a QKV phase (``wait = NAME, wait_target = N``): every
    CTA's threads first wait (acquire, GPU scope, bounded) until counter ``NAME[0]`` reaches
    ``N``, the QKV phase's group flushes (``group_flush {signal = NAME}``: one signal a group).
"""
from __future__ import annotations

import math

import numpy as np

from fusionc.interp.numerics import round_to
from fusionc.ir.ops.norm import rms_norm_values
from fusionc.ir.ops.rope import rope_values
from fusionc.ir.ops.tile_memory import K, param_of
from fusionc.ir.registry import (FLOAT, FLOATS, NONNEG_INT, POS_INT, STR, Cost, OpDef, attr, enum,
                                 fail, register)
from fusionc.ir.types import FLOAT_DTYPES, DType

TILE = 128   # tokens per chunk step: chunk lengths are multiples of it
MAX_SPLITS = 64   # chunks of one (b, h) at most: the merging unit reads them all
WAVES = 8         # unit sizes tried by the split plan: T / (grid · w) tiles, w = 1 .. WAVES
UNIT_OVERHEAD = 1   # a unit's fixed cost in tiles (ring fill, q staging, partial write)


def split_plan(lens, kv_heads: int, grid: int, max_seq: int, tile: int = TILE):
    """(L, splits) of one launch from the run-time ``lens`` (seq_lens, clamped to [0, max_seq])
    on ``grid`` CTAs: row b's chunk length ``L[b]`` (a multiple of ``tile``) and its chunks
    ``splits[b]``.

    With t_b = ⌈n_b / tile⌉ and T = kv_heads · Σ_b t_b tiles in all, a unit of w waves takes
    about per_w = ⌈T / (grid · w)⌉ tiles: s_b = clamp(⌈t_b / per_w⌉, 1, MAX_SPLITS) chunks of
    c_b = ⌈t_b / s_b⌉ tiles each, so that the chunks of a row are equal (units of one size
    balance over the CTAs), then splits_b = max(1, ⌈t_b / c_b⌉) ≤ s_b so that no chunk is empty
    (t = 130, s = 64 gives chunks of 3 tiles: 44 of them). Of w = 1 .. WAVES, the plan takes
    the least ⌈U_w / grid⌉ · (max_b c_b + UNIT_OVERHEAD), U_w = kv_heads · Σ splits_b units (the
    first on ties): more waves of smaller units where whole rows leave the last wave nearly
    empty (40 MHA heads × 4 rows = 160 units on 132 CTAs: 5 waves of 640 quarter-rows, not 2
    of 160). The units
    number at most grid · WAVES + B · kv_heads (:func:`slots`). The CUDA code
    (``templates/attn_plan.cu.j2``) computes the same numbers with ``grid`` its launch's CTAs
    (fewer than the op's when the GPU holds fewer: the chunks then differ from the
    simulator's, the results only by rounding)."""
    n = np.clip(np.asarray(lens, np.int64), 0, max_seq)
    tiles = -(-n // tile)
    total = int(tiles.sum()) * kv_heads
    best = None
    for w in range(1, WAVES + 1):
        per = max(1, -(-total // (grid * w)))
        chunk, splits = _chunks(tiles, per)
        top = int(chunk.max()) if len(chunk) else 0
        cost = -(-int(splits.sum()) * kv_heads // grid) * (top + UNIT_OVERHEAD)
        if best is None or cost < best[0]:
            best = (cost, chunk, splits)
    return tile * best[1], best[2]


def _chunks(tiles, per: int):
    """(c_b, splits_b) at ``per`` tiles a unit (:func:`split_plan`)."""
    chunk = np.maximum(1, -(-tiles // np.clip(-(-tiles // per), 1, MAX_SPLITS)))
    return chunk, np.maximum(1, -(-tiles // chunk))   # no chunk left empty


STEP = 16         # tokens per warp step (the mma's k for P·V)
QBLOCK = 16   # query heads of one unit: the mma's 16 rows (a larger group: blocks of 16)


def q_blocks(group: int) -> int:
    """Units per (row, chunk, KV head): the query blocks of a group of ``group`` heads."""
    return -(-group // QBLOCK)


def block_rows(group: int) -> int:
    """Query heads of one block (the last may have fewer)."""
    return min(group, QBLOCK)


MAX_HEAD_DIM = {"f32": 192, "16-bit": 256}   # past them ptxas spills o (NVRTC 13, 2026-12-07)


def unsupported(dtype: DType, heads: int, kv_heads: int, head_dim: int) -> list[str]:
    """Why the attention units cannot take this head geometry (empty: they can). The code
    generator (``fusionc.codegen.attn_units``) and the default lowering both ask this.
    :data:`MAX_HEAD_DIM`: o's accumulators take head_dim / 2 registers a lane; past 256
    (16-bit) or 192 (f32, whose FMA path also holds q and K in registers) ptxas spills them."""
    bad = []
    if head_dim % 16:
        bad.append(f"head_dim {head_dim} (not a multiple of 16)")
    if dtype == DType.f32 and head_dim > MAX_HEAD_DIM["f32"]:
        bad.append(f"f32 at head_dim {head_dim} (FMA: up to {MAX_HEAD_DIM['f32']}; ptxas "
                   "spills the fp32 accumulators above)")
    elif dtype not in (DType.f16, DType.bf16, DType.f32):
        bad.append(f"dtype {dtype} (f16 or bf16 on tensor cores, f32 by FMA)")
    return bad


def fast(head_dim: int) -> bool:
    """Whether the units keep their accumulators in registers at this head_dim in 16-bit (the
    default lowering sends others to the mixed path's host attention): up to
    :data:`MAX_HEAD_DIM` (the template's K/V copies take a power of two of lanes a row, so
    their addresses stay affine: at head_dim 192-240
    the earlier packed copies' hoisted addresses spilled)."""
    return head_dim <= MAX_HEAD_DIM["16-bit"]


def slots(max_batch: int, kv_heads: int, grid: int) -> int:   # grid: units at once
    """Partial slots a launch may fill (one per unit): U ≤ T / per + B · kv_heads ≤
    grid · WAVES + max_batch · kv_heads (:func:`split_plan`; ``kv_heads``: units per chunk,
    KV heads × query blocks)."""
    return grid * WAVES + max_batch * kv_heads


def _shapes(op):
    qkv, kc, o = op.operands[0].type, op.operands[1].type, op.operands[5].type
    kvh, d = kc.shape[2], kc.shape[3]
    return qkv, kc, o, kvh, d


def _infer(op):
    qkv, kc, vc, pos, lens, o = (v.type for v in op.operands[:6])
    if kc != vc or kc.rank != 4 or not all(isinstance(x, int) for x in kc.shape[1:]):
        fail(op, f"k_cache {kc} and v_cache {vc}", "equal caches [B, S, KV, D], S, KV, D static")
    b, _, kvh, d = kc.shape
    if o.rank != 2 or not isinstance(o.shape[1], int) or o.shape[1] % (kvh * d) or \
            o.shape[0] != b:
        fail(op, f"o {o} with caches {kc}", f"o [{b}, H·{d}] with H a multiple of {kvh}")
    h = o.shape[1] // d
    want = (b, (h + 2 * kvh) * d)
    if qkv.rank != 2 or qkv.shape != want:
        fail(op, f"qkv {qkv}", f"qkv [{', '.join(map(str, want))}] (q, k, v heads)")
    if len({qkv.dtype, kc.dtype, o.dtype}) != 1 or qkv.dtype not in FLOAT_DTYPES:
        fail(op, f"dtypes {qkv.dtype}, {kc.dtype}, {o.dtype}", "one float dtype")
    for t, what in ((pos, "positions"), (lens, "seq_lens")):
        if t.dtype != DType.i32 or t.shape != (b,):
            fail(op, f"{what} has type {t}", f"i32[{b}]")
    for v in op.operands[6:]:
        if v.type.shape != (d,) or v.type.dtype != qkv.dtype:
            fail(op, f"norm weight %{v.name}: {v.type}",
                 f"{qkv.dtype}[{d}] (QK-norm over head_dim, the qkv dtype)")
    if len(op.operands) == 7:
        fail(op, "q_norm without k_norm", "both QK-norm weights or neither")
    r = op.attr("rotary_dim")
    if r % 2 or r > d:
        fail(op, f"rotary_dim = {r}", f"an even rotary_dim <= head_dim {d}")
    if not 0 < op.attr("scale") < math.inf or not 0 < op.attr("theta") < math.inf:
        fail(op, f"scale = {op.attr('scale')}, theta = {op.attr('theta')}", "finite, > 0")
    return ()


def verify_units(op, graph, module):
    """Every tensor is a kernel parameter; ``grid`` is the kernel's CTAs (``attn_units`` and
    ``mla_units``); ``signal`` and ``wait`` only in an attention phase of a streamed kernel."""
    phase = graph is not None and any(o.name == "units" for o in graph.body)
    for v in op.operands:
        param_of(op, graph, v, f"{op.name} operands")
    if op.name == "attn_units" and graph is not None and not phase and \
            (op.attr("signal") or op.attr("wait")):
        fail(op, f"signal = {op.attr('signal')!r}, wait = {op.attr('wait')!r} in a kernel "
                 "without units regions", "signal and wait only in an attention phase of a "
                 "streamed kernel (attn_units before or between its units regions)")
    if graph is not None and op.attr("grid") != graph.attr("grid") * graph.attr("cluster"):
        fail(op, f"grid = {op.attr('grid')} on {graph.attr('grid')} x "
             f"{graph.attr('cluster')} CTAs", "grid = the kernel's CTAs")


def head_vectors(op, qkv_row: np.ndarray, pos: int, h: int, norms) -> tuple:
    """(q [G, D], k [D], v [D]) of KV head ``h`` for one batch row, as the graph computes them
    (each step rounded to the qkv dtype), in fp32."""
    _, kc, o, kvh, d = _shapes(op)
    dt = op.operands[0].type.dtype
    heads = o.shape[1] // d
    g = heads // kvh
    x = np.asarray(qkv_row, np.float32)
    q = x[h * g * d:(h + 1) * g * d].reshape(g, d)
    k = x[(heads + h) * d:(heads + h + 1) * d][None]
    v = x[(heads + kvh + h) * d:(heads + kvh + h + 1) * d]
    if norms:
        q, k = (_rms(t, w, op.attr("eps"), dt) for t, w in ((q, norms[0]), (k, norms[1])))
    return _rope(op, q, pos, dt), _rope(op, k, pos, dt)[0], v


def _rms(x, w, eps, dt):
    return round_to(rms_norm_values(x, np.asarray(w), eps, np.float32), dt).astype(np.float32)


def _rope(op, x, pos, dt):
    y = rope_values(x[None], np.array([pos]), op, np.float32)[0]
    return round_to(y, dt).astype(np.float32)


def _simulate(op, args, cta):
    """This CTA's units (:func:`_units`). In an attention phase (a streamed kernel's CTA) a
    blocking rule: the scheduler runs other coroutines between its units and while it waits
    for the QKV phase's flushes (``wait``)."""
    gen = _units(op, cta)
    if getattr(cta, "stream", None) is not None:
        return gen
    try:   # a kernel of its own: nothing else runs beside it
        while True:
            next(gen)
    except StopIteration as stop:
        return stop.value


def _units(op, cta):
    """This CTA's units ``gid``, ``gid + grid``, ...; partials in ``memory.attn_slots``,
    merged by the last unit of each (b, h), in chunk order."""
    mem = cta.memory
    stream = getattr(cta, "stream", None)   # an attention phase: the launch's CTAs
    if op.attr("wait"):
        yield from stream.acquire(op, op.attr("wait"), op.attr("wait_target"))
    pos, lens, *norms = (mem.read(v.name, (Ellipsis,), cta, op)
                         for v in op.operands[3:5] + op.operands[6:])
    name = op.operands[0].name
    qkv = stream.global_rows(op, name) if stream is not None and name in stream.outputs \
        else mem.read(name, (Ellipsis,), cta, op)
    _, kc, o, kvh, d = _shapes(op)
    S, grid = kc.shape[1], stream.grid.size if stream is not None else op.attr("grid")
    group = o.shape[1] // d // kvh
    qb_n, rows = q_blocks(group), block_rows(group)
    L, splits = split_plan(lens, kvh * qb_n, grid, S, op.attr("tile"))
    first = np.concatenate([[0], np.cumsum(splits * kvh * qb_n)])
    store = mem.__dict__.setdefault("attn_slots", {})
    for u in range(cta.gid, int(first[-1]), grid):
        b = int(np.searchsorted(first, u, side="right")) - 1
        c, hq = divmod(u - int(first[b]), kvh * qb_n)   # (b, c, h, qb): a chunk's side by side
        h, qb = divmod(hq, qb_n)
        p = int(pos[b])
        q, kn, vn = head_vectors(op, qkv[b], p, h, norms)
        q = q[qb * rows:(qb + 1) * rows]
        names = [v.name for v in op.operands[1:3]]
        if c == 0 and qb == 0 and 0 <= p < S:
            for name, x in zip(names, (kn, vn)):
                mem.write(name, (b, p, h), x, cta, op, kc.dtype)
        n = min(max(int(lens[b]), 0), S)
        lo, hi = min(n, c * int(L[b])), min(n, (c + 1) * int(L[b]))
        part = _partial(op, cta, names, b, h, lo, hi, p, q, kn, vn)
        got = store.setdefault((id(op), b, hq), {})
        got[c] = part
        if len(got) == splits[b]:
            out = _merge([got[i] for i in range(int(splits[b]))])
            del store[(id(op), b, hq)]
            at = (h * group + qb * rows) * d
            mem.write(op.operands[5].name, (b, slice(at, at + out.size)), out.reshape(-1), cta,
                      op, o.dtype)
        if stream is not None:
            yield None   # a scheduling point after every unit
    if op.attr("signal"):
        stream.add((op.attr("signal"), 0))
    return ()


def _partial(op, cta, names, b, h, lo, hi, p, q, kn, vn):
    g, d = q.shape
    if hi <= lo:
        return (np.full(g, -np.inf, np.float32), np.zeros(g, np.float32),
                np.zeros((g, d), np.float32))
    rows = []
    for name, new in zip(names, (kn, vn)):
        x = np.empty((hi - lo, d), np.float32)
        for a, z in ((lo, p), (p + 1, hi)) if lo <= p < hi else ((lo, hi),):
            if z > a:
                x[a - lo:z - lo] = cta.memory.read(name, (b, slice(a, z), h), cta, op)
        if lo <= p < hi:
            x[p - lo] = new
        rows.append(x)
    s = (q @ rows[0].T) * np.float32(op.attr("scale"))
    m = s.max(axis=1)
    e = np.exp(s - m[:, None])
    pv = round_to(e, op.operands[0].type.dtype).astype(np.float32)   # P as the mma's operand
    return m, e.sum(axis=1), pv @ rows[1]


def partial_merge(parts) -> tuple:
    """(max m, Σ_c e_c l_c, Σ_c e_c o_c) of partials (m, l, o) in order, e_c = exp(m_c −
    max m) (0 for empty chunks): an unnormalised partial itself (mla_units' two levels)."""
    m = np.stack([x[0] for x in parts])
    top = m.max(axis=0)
    with np.errstate(invalid="ignore"):
        e = np.where(np.isneginf(m), np.float32(0), np.exp(m - top)).astype(np.float32)
    den = sum(e[i] * x[1] for i, x in enumerate(parts))
    num = sum(e[i][:, None] * x[2] for i, x in enumerate(parts))
    return top, den, num


def _merge(parts):
    """o = Σ_c e_c o_c / Σ_c e_c l_c (:func:`partial_merge`), 0 where no token counted."""
    _, den, num = partial_merge(parts)
    return np.where(den[:, None] > 0, num / np.where(den > 0, den, 1)[:, None], 0)


def _cost(op, env):
    qkv, kc, o, kvh, d = _shapes(op)
    b = qkv.concrete(env)[0]
    s = env.get("S", kc.shape[1])
    kv = 2 * b * s * kvh * d * kc.dtype.itemsize
    g = op.attr("grid")   # per CTA, as kernel_cost counts every op (it scales by the grid)
    return Cost(bytes_read=(qkv.nbytes(env) + kv) / g, bytes_written=o.nbytes(env) / g,
                flops=4 * b * (o.shape[1] // d) * s * d / g)


register(OpDef(
    "attn_units", __doc__,
    ("qkv", "k_cache", "v_cache", "positions", "seq_lens", "o", "q_norm?", "k_norm?"),
    (attr("grid", POS_INT, doc="CTAs of the launch: the work units' stride"),
     attr("scale", FLOAT), attr("theta", FLOAT),
     attr("style", enum("neox", "gptj"), "neox"), attr("rotary_dim", POS_INT),
     attr("scaling", FLOATS, ()), attr("eps", FLOAT, 1e-6, doc="QK-norm epsilon"),
     attr("tile", POS_INT, TILE, doc="tokens per chunk step"),
     attr("signal", STR, "", omit=True,
          doc="counter a CTA signals once its units are done (an attention phase)"),
     attr("wait", STR, "", omit=True, doc="counter waited on before qkv is read"),
     attr("wait_target", NONNEG_INT, 0, omit=True, doc="signals the wait needs")),
    _infer, where=K, simulate=_simulate, verify=verify_units, cost=_cost))
