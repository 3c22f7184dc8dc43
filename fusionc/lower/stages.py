"""Stage matchers of the cluster kernels (lowering v1): attention blocks (anchor
``decode_attention``). See :mod:`fusionc.lower.match` for the stage descriptions. MLP blocks and
other linears are design v2's (:mod:`fusionc.lower.match_v2`), and so are MLA blocks (anchor
``mla_decode_attention``, :mod:`fusionc.lower.mla_v2`): lowering v1 names them
(:func:`refuse_mla`)."""
from __future__ import annotations

from fusionc.errors import LoweringError
from fusionc.ir.nodes import Graph, Op, Value
from fusionc.lower.match import (AttentionStage, Dataflow, Norm, input_norm, projection,
                                 residual_tail)


def find_stages(g: Graph) -> list:
    """Every attention stage of ``g``, in program order; LoweringError for an MLA attention
    (:func:`refuse_mla`)."""
    df = Dataflow(g)
    out = []
    for op in g.body:
        if op.name == "decode_attention":
            out.append(match_attention(df, op))
        elif op.name == "mla_decode_attention":
            raise refuse_mla(op)
    return out


def refuse_mla(op: Op) -> LoweringError:
    """The error of lowering v1 on an MLA attention ``op``: v1 has no MLA kernel (issue 27
    deleted it), lowering v2's MLA units take the block."""
    return LoweringError("lowering v1 has no MLA kernel", op=op.name, loc=op.loc,
                         valid="lowering v2, whose MLA units take the block: fusionc.compile "
                               "without lowering='v1', cluster or scheme (or lowering='v2'); "
                               "--lowering auto or v2 without --cluster / --scheme on the "
                               "command line")


def _head_chain(df: Dataflow, v: Value, at: Op):
    """Follow [rope] ← [rms_norm] ← reshape from a projection; returns the pieces."""
    ops, rope, norm = [], None, None
    r = df.producer(v, "rope")
    if r is not None:
        rope, positions = r, r.operands[1]
        ops.append(r)
        v = r.operands[0]
    n = df.producer(v, "rms_norm")
    if n is not None:
        norm = Norm(df.param(n.operands[1], "QK-norm weight", n), n.attr("eps"), n.loc)
        ops.append(n)
        v = n.operands[0]
    rs = df.producer(v, "reshape")
    if rs is None or rs.operands[0].type.rank != 2:
        raise LoweringError(f"%{v.name} is not heads split from a projection", op=at.name,
                            loc=at.loc, valid="reshape(linear(...)) to [B, heads, head_dim]")
    ops.append(rs)
    rows, h, pops = projection(df, rs.operands[0], rs)
    rope_key = None if rope is None else rope.attrs
    return rows, h, norm, rope_key, (positions if rope is not None else None), ops + pops


def match_attention(df: Dataflow, att: Op) -> AttentionStage:
    """The AttentionStage around ``att`` (a decode_attention op); LoweringError when the dataflow
    around it is not an attention block fusionc can fuse.
    """
    q, kc, vc, lens = att.operands
    heads, head_dim = q.type.shape[1], q.type.shape[2]
    kv_heads = kc.type.shape[2]
    ops = [att]
    qrows, hq, qn, qrope, qpos, qops = _head_chain(df, q, att)
    app = df.producer(kc, "kv_cache_append")
    if app is None or df.producer(vc, "kv_cache_append") is not app or \
            [r.name for r in app.results] != [kc.name, vc.name]:
        raise LoweringError("attention over a KV cache not appended in this graph (or with "
                            "the appended K and V caches swapped)",
                            op=att.name, loc=att.loc,
                            valid="k_cache, v_cache = kv_cache_append(...) before attention")
    kc0, vc0, k, v, positions = app.operands
    for c in (kc0, vc0):   # appended in place: a later read of the old cache would see the new row
        if df.uses.get(c.name) != [app] or any(o.name == c.name for o in df.graph.outputs):
            raise LoweringError(f"the cache %{c.name} is read beside its kv_cache_append",
                                op=app.name, loc=app.loc,
                                valid="caches read only by the append (it updates them in "
                                      "place); use the appended caches it returns")
    krows, hk, kn, krope, kpos, kops = _head_chain(df, k, app)
    vrows, hv, vn, vrope, _, vops = _head_chain(df, v, app)
    if not (hq.name == hk.name == hv.name):
        raise LoweringError("q, k and v are projected from different inputs", op=att.name,
                            loc=att.loc, valid="one normalized hidden state h")
    _check_rope(att, qrope, krope, vrope is not None or vn is not None,
                [p for p in (qpos, kpos) if p is not None and p.name != positions.name],
                positions)
    x, norm, nops = input_norm(df, hq, att)
    for w in (kc0, vc0, lens, positions):
        df.param(w, "cache, length or position input", att)
    ops += [app] + qops + kops + vops + nops
    out, oproj = att.result, None
    flat = df.sole_use(out, "reshape")
    if flat is not None:
        lin = df.sole_use(flat.result, "linear")
        if lin is not None and len(lin.operands) == 2:
            oproj = df.param(lin.operands[1], "output projection weight", lin)
            ops += [flat, lin]
            out = lin.result
    residual, out, rops = residual_tail(df, out) if oproj is not None else (None, out, [])
    return AttentionStage(
        tuple(_unique(ops + rops)), x, norm, qrows, krows, vrows, heads, kv_heads, head_dim,
        qn, kn, qrope, positions, kc0, vc0, lens, att.attr("scale"), app.results,
        oproj, residual, out)


def _check_rope(att: Op, qrope, krope, v_changed: bool, other_positions: list,
                positions: Value) -> None:
    """LoweringError unless q and k take the same RoPE at the append's positions and v none."""
    valid = "the same rope(positions) on q and k, none on v"
    if qrope != krope:
        raise LoweringError("q and k take different RoPE" if qrope and krope else
                            f"only {'q' if qrope else 'k'} is rotated (RoPE)",
                            op=att.name, loc=att.loc, valid=valid)
    if v_changed:
        raise LoweringError("v is rotated or normalized", op=att.name, loc=att.loc,
                            valid=valid)
    if other_positions:
        raise LoweringError(f"RoPE takes positions %{other_positions[0].name}, the KV append "
                            f"%{positions.name}", op=att.name, loc=att.loc,
                            valid="one positions input for rope(q), rope(k) and "
                                  "kv_cache_append (the new token's position)")


def _unique(ops: list[Op]) -> list[Op]:
    seen, out = set(), []
    for o in ops:
        if id(o) not in seen:
            seen.add(id(o))
            out.append(o)
    return out
