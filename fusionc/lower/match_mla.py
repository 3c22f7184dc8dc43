"""Find a multi-head latent attention (MLA) block by dataflow, from its ``mla_decode_attention``.

The block (DeepSeek-V2, arXiv 2405.04434, §2.1 and appendix C; examples/deepseek_v2_lite.py):
x → [RMSNorm] → h; q = heads(linear(h, w_q)) split into (q_nope, q_rope), q_rope → [RoPE];
[c ; k_rope] = split(linear(h, w_kv_a)), c → [RMSNorm], k_rope → [RoPE]; the cache appended with
[c ; k_rope]; q_latent = head_linear(q_nope, w_uk_t); attention over the latent cache;
o = head_linear(o_latent, w_uv); out = [x +] linear(merge_heads(o), w_o).
"""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.errors import LoweringError
from fusionc.ir.nodes import Op, Value
from fusionc.lower.match import Dataflow, Norm, Rows, input_norm, projection, residual_tail


@dataclass(frozen=True)
class MLAStage:
    """An MLA block. Shapes: x [B, hidden]; heads × (nope + rope) query rows of ``q``; the cache
    [B, max_seq, latent + rope]; w_uk_t [heads, latent, nope]; w_uv [heads, v_head, latent];
    o_proj [N, heads · v_head]. ``rope`` is the attributes of q's rope op (None: no RoPE)."""

    ops: tuple[Op, ...]
    x: Value
    norm: Norm | None
    q: Rows
    c: Rows
    k_rope: Rows
    kv_norm: Norm | None
    heads: int
    nope: int
    rope_dim: int
    latent: int
    v_head: int
    rope: tuple | None
    positions: Value
    cache: Value
    cache_out: Value
    seq_lens: Value
    scale: float
    w_uk: Value
    w_uv: Value
    o_proj: Value
    residual: Value | None
    out: Value

    @property
    def in_place(self) -> dict[str, Value]:
        """Inputs the block updates in place → the graph values they become."""
        return {self.cache.name: self.cache_out}


def _fail(what: str, at: Op, valid: str):
    raise LoweringError(what, op=at.name, loc=at.loc, valid=valid)


def _strip(df: Dataflow, v: Value, name: str) -> tuple[Value, Op | None]:
    """``v = name(u, ...)`` → (u, op); otherwise (v, None)."""
    op = df.producer(v, name)
    return (op.operands[0], op) if op is not None else (v, None)


def _query(df: Dataflow, ql: Op, q_rope: Value, att: Op):
    """q_latent = head_linear(q_nope, w_uk_t), (q_nope, q_rope) = split(reshape(linear(h, w_q)))."""
    if ql is None:
        _fail("the latent query is not head_linear(q_nope, w_uk_t)", att,
              "q_latent = head_linear(q_nope, w_uk_t) (W_UK absorbed)")
    w_uk = df.param(ql.operands[1], "W_UK", ql)
    rope_src, rope_op = _strip(df, q_rope, "rope")
    sp = df.producer(ql.operands[0], "split")
    if sp is None or len(sp.results) != 2 or sp.results[1].name != rope_src.name:
        _fail("q_nope and q_rope are not the two parts of one split of the query heads", att,
              "q_nope, q_rope = split(reshape(linear(h, w_q)), [nope, rope], axis=-1)")
    heads_v, rs = _strip(df, sp.operands[0], "reshape")
    if rs is None or heads_v.type.rank != 2:
        _fail("the query heads are not reshaped from a [B, heads·(nope + rope)] projection", sp,
              "reshape(linear(h, w_q)) to [B, heads, nope + rope]")
    rows, h, pops = projection(df, heads_v, rs)
    return rows, h, w_uk, rope_op, [ql, sp, rs] + ([rope_op] if rope_op else []) + pops


def _latent_kv(df: Dataflow, app: Op):
    """[c ; k_rope] = split(linear(h, w_kv_a)); c → [RMSNorm]; k_rope → [reshape, RoPE, reshape]."""
    _, c, kr, positions = app.operands
    ops = [app]
    kv_norm = None
    n = df.producer(c, "rms_norm")
    if n is not None:
        kv_norm = Norm(df.param(n.operands[1], "latent norm weight", n), n.attr("eps"), n.loc)
        ops.append(n)
        c = n.operands[0]
    kr, r1 = _strip(df, kr, "reshape")
    kr, rope_op = _strip(df, kr, "rope")
    kr, r0 = _strip(df, kr, "reshape")
    ops += [o for o in (r1, rope_op, r0) if o is not None]
    crows, hc, cops = projection(df, c, app)
    krows, hk, kops = projection(df, kr, app)
    if hc.name != hk.name or crows.weight.name != krows.weight.name:
        _fail("the latent and the RoPE key come from different projections", app,
              "c, k_rope = split(linear(h, w_kv_a), [latent, rope])")
    return crows, krows, kv_norm, rope_op, positions, hc, ops + cops + kops


def _output(df: Dataflow, att: Op):
    """o = head_linear(o_latent, w_uv) → reshape → linear(·, w_o) → [+ residual]."""
    hl = df.sole_use(att.result, "head_linear")
    flat = df.sole_use(hl.result, "reshape") if hl is not None else None
    lin = df.sole_use(flat.result, "linear") if flat is not None else None
    if lin is None or len(lin.operands) != 2:
        _fail("the latent attention output is not expanded by W_UV and projected", att,
              "linear(reshape(head_linear(o_latent, w_uv), [B, heads·v_head]), w_o)")
    w_uv = df.param(hl.operands[1], "W_UV", hl)
    w_o = df.param(lin.operands[1], "output projection weight", lin)
    residual, out, rops = residual_tail(df, lin.result)
    return w_uv, w_o, residual, out, [hl, flat, lin] + rops


def match_mla(df: Dataflow, att: Op) -> MLAStage:
    """The MLAStage around ``att`` (an ``mla_decode_attention``); LoweringError naming the op
    when the dataflow is not an MLA block fusionc can fuse (see the module docstring)."""
    ql_v, qr_v, cache1, lens = att.operands
    app = df.producer(cache1, "latent_cache_append")
    if app is None:
        _fail("attention over a latent cache not appended in this graph", att,
              "cache = latent_cache_append(cache, c, k_rope, positions) before the attention")
    qrows, hq, w_uk, qrope, qops = _query(df, df.producer(ql_v, "head_linear"), qr_v, att)
    crows, krows, kv_norm, krope, positions, hk, kops = _latent_kv(df, app)
    if hq.name != hk.name:
        _fail("the query and the latent are projected from different inputs", att,
              "one normalized hidden state h")
    if (qrope is None) != (krope is None) or (qrope is not None and (
            qrope.attrs != krope.attrs or qrope.operands[1].name != positions.name
            or krope.operands[1].name != positions.name)):
        _fail("q_rope and k_rope take different RoPE or positions", att,
              "the same rope(positions) on q_rope and k_rope")
    x, norm, nops = input_norm(df, hq, att)
    for v in (app.operands[0], lens, positions):
        df.param(v, "cache, length or position input", att)
    w_uv, w_o, residual, out, oops = _output(df, att)
    heads, latent, nope = w_uk.type.shape
    rope_dim, v_head = krows.rows, w_uv.type.shape[1]
    if qrows.rows != heads * (nope + rope_dim) or w_uv.type.shape[2] != latent \
            or w_o.type.shape[1] != heads * v_head or crows.rows != latent:
        _fail("projection sizes do not match heads, latent, nope, rope and v_head", att,
              "w_q [heads·(nope + rope), hidden], w_kv_a [latent + rope, hidden], "
              "w_uk_t [heads, latent, nope], w_uv [heads, v_head, latent], "
              "w_o [hidden, heads·v_head]")
    ops = [att] + qops + kops + nops + oops
    seen, uniq = set(), []
    for o in ops:
        if id(o) not in seen:
            seen.add(id(o))
            uniq.append(o)
    return MLAStage(tuple(uniq), x, norm, qrows, crows, krows, kv_norm, heads, nope, rope_dim,
                    latent, v_head, None if qrope is None else qrope.attrs, positions,
                    app.operands[0], app.result, lens, att.attr("scale"), w_uk, w_uv, w_o,
                    residual, out)
