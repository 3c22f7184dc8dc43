"""Find decoder stages in a graph by dataflow: attention blocks (the cluster kernels of
lowering v1; MLP blocks are design v2's, :mod:`fusionc.lower.match_v2`).

Matching starts from an anchor op (``decode_attention``) and follows operands
backwards and uses forwards through optional steps (RMSNorm, QK-norm, RoPE, KV append, output
projection, residual add). Nothing depends on model names; what varies between models (GQA,
QK-norm, head_dim, hidden ≠ heads·head_dim, no RoPE, fused or separate projections) is data in
the stage description.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusionc.errors import Loc, LoweringError
from fusionc.ir.nodes import Graph, Op, Value


@dataclass(frozen=True)
class Rows:
    """Rows [row0, row0 + rows) of a weight parameter [N, K] produce a projection; ``loc`` is
    the DSL line of the linear op (tile ops lowered from it carry it)."""

    weight: Value
    row0: int
    rows: int
    loc: Loc | None = None


@dataclass(frozen=True)
class Norm:
    """An RMSNorm: weight parameter, eps and the DSL line of the op."""

    weight: Value
    eps: float
    loc: Loc | None = None


@dataclass(frozen=True)
class AttentionStage:
    """x → [RMSNorm] → q/k/v projections → [QK-norm] → [RoPE] → [KV append] → attention →
    [output projection] → [+ residual]. Shapes: x [B, hidden]; heads, kv_heads, head_dim."""

    ops: tuple[Op, ...]
    x: Value
    norm: Norm | None
    q: Rows
    k: Rows
    v: Rows
    heads: int
    kv_heads: int
    head_dim: int
    q_norm: Norm | None
    k_norm: Norm | None
    rope: tuple | None  # the attributes of q's rope op ((name, value) pairs)
    positions: Value | None
    k_cache: Value
    v_cache: Value
    seq_lens: Value
    scale: float
    cache_outs: tuple[Value, Value] | None
    o_proj: Value | None
    residual: Value | None
    out: Value

    @property
    def in_place(self) -> dict[str, Value]:
        """Inputs the block updates in place → the graph values they become."""
        return dict(zip((self.k_cache.name, self.v_cache.name), self.cache_outs or ()))


class Dataflow:
    """Definitions and uses of the values of one graph."""

    def __init__(self, g: Graph):
        self.graph = g
        self.defs: dict[str, Op] = {}
        self.uses: dict[str, list[Op]] = {}
        self.params = {p.name for p in g.params}
        for op in g.body:
            for r in op.results:
                self.defs[r.name] = op
            for v in op.operands:
                self.uses.setdefault(v.name, []).append(op)

    def producer(self, v: Value, name: str | None = None) -> Op | None:
        """The op defining ``v`` if it is named ``name`` (any when None)."""
        op = self.defs.get(v.name)
        return op if op is not None and (name is None or op.name == name) else None

    def sole_use(self, v: Value, name: str) -> Op | None:
        """The only user of ``v`` if it is an op named ``name`` and ``v`` is not returned."""
        users = self.uses.get(v.name, [])
        returned = any(o.name == v.name for o in self.graph.outputs)
        if len(users) == 1 and users[0].name == name and not returned:
            return users[0]
        return None

    def param(self, v: Value, what: str, at: Op) -> Value:
        if v.name not in self.params:
            raise LoweringError(
                f"{what} %{v.name} is computed in the graph",
                op=at.name,
                loc=at.loc,
                valid=f"{what} as a graph parameter",
            )
        return v


def projection(df: Dataflow, v: Value, at: Op) -> tuple[Rows, Value, list[Op]]:
    """Trace value ``v`` [B, N] back to rows of a linear: ``linear(h, w)`` directly or one
    output of ``split(linear(h, w))`` along the last axis. Returns the rows, h and the ops."""
    ops, row0 = [], 0
    sp = df.producer(v, "split")
    if sp is not None:
        if sp.attr("axis") % sp.operands[0].type.rank != sp.operands[0].type.rank - 1:
            raise LoweringError(
                "split of a projection not along features",
                op=sp.name,
                loc=sp.loc,
                valid="split along the last axis",
            )
        idx = [r.name for r in sp.results].index(v.name)
        row0 = sum(sp.attr("sizes")[:idx])
        ops.append(sp)
        v = sp.operands[0]
    lin = df.producer(v, "linear")
    if lin is None:
        raise LoweringError(
            f"%{v.name} is not produced by a linear projection",
            op=at.name,
            loc=at.loc,
            valid="q, k, v (and gate, up) from linear(h, w)",
        )
    if len(lin.operands) == 3:
        raise LoweringError(
            "projection bias is not supported by the fused lowering yet",
            op=lin.name,
            loc=lin.loc,
            valid="linear(x, w) without bias",
        )
    w = df.param(lin.operands[1], "projection weight", lin)
    n = v.type.shape[-1] if sp is None else sp.attr("sizes")[idx]
    return Rows(w, row0, n, lin.loc), lin.operands[0], ops + [lin]


def input_norm(df: Dataflow, h: Value, at: Op) -> tuple[Value, Norm | None, list[Op]]:
    """h = rms_norm(x, w) → (x, Norm, [op]); otherwise h is the stage input itself. The input
    must be [B, hidden] (one vector per batch row)."""
    n = df.producer(h, "rms_norm")
    x, norm, ops = h, None, []
    if n is not None:
        x, norm, ops = (
            n.operands[0],
            Norm(df.param(n.operands[1], "norm weight", n), n.attr("eps"), n.loc),
            [n],
        )
    if x.type.rank != 2:
        raise LoweringError(
            f"the block input %{x.name} has type {x.type}",
            op=at.name,
            loc=at.loc,
            valid="a hidden state of shape [B, hidden]",
        )
    return x, norm, ops


def residual_tail(df: Dataflow, y: Value) -> tuple[Value | None, Value, list[Op]]:
    """``add(y, r)`` (either order) as the sole use of y → (r, out, [op])."""
    add = df.sole_use(y, "add")
    if add is None:
        return None, y, []
    a, b = add.operands
    r = b if a.name == y.name else a
    return r, add.result, [add]
