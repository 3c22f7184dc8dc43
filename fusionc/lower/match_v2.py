"""Which graph ops a design-v2 linear kernel absorbs: an RMSNorm prologue and an epilogue chain.

For each ``linear`` of a graph, in program order (:func:`linear_kernels`):

- **prologue**: its x is ``rms_norm(x0, gamma)`` whose every use is the x of a linear (and not
  a graph output): the kernel reads x0 and applies the norm itself (``row_rms`` per CTA, then
  ``round(x · r · gamma)`` on the activation tiles), so the normed tensor never exists;
- **pair**: its result feeds only ``split`` into two equal halves whose only use is one
  ``silu_mul(gate, up)`` (or ``mul(silu(gate), up)``): one kernel with paired gate/up tiles
  writes the SwiGLU output (the fused ``w_gate_up`` form of ``fusionc.models.blocks``);
- **epilogue**: then, while the value has one use and is not a graph output, ``silu``,
  ``cast`` to a float dtype, and ``add`` / ``mul`` with a tensor of the same shape that exists before the linear
  runs (a graph input or an earlier kernel's output) join the flush.

Each absorbed op reads its operand rounded to that value's dtype (a ``round_*`` step), as the
graph computes it. What a kernel absorbs is never materialized; every other op must itself be a
kernel's output.

**Heads** (:func:`head_kernels`): a ``head_linear`` (MLA's absorbed W_UK and W_UV) is a
block-diagonal kernel over its weight's ``[H·N, K]`` row view (:mod:`fusionc.lower.match_heads`),
in program order among the linears; it may start a chain, never continue one.

**Chains** (:func:`chains`): a linear kernel whose x is the previous one's output, used by it
alone, runs as the next phase of the same persistent kernel (the MLP's gate/up then down), when
both stream their tiles through the ring (row bytes a multiple of 16) in one dtype and it has no
RMSNorm prologue. **Siblings** (:func:`sibling`): kernels that read the same x through the
same prologue (an MLA block's w_q and w_kv_a) are phases of one kernel too, without waits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from fusionc.ir.nodes import Graph, Op, Value, users
from fusionc.ir.types import FLOAT_DTYPES
from fusionc.stream.ring import tma_rows


@dataclass
class LinearKernel:
    """One v2 linear kernel: the ``linear`` op, what it absorbed, its output value."""

    linear: Op
    norm: Op | None = None            # rms_norm prologue
    split: int = 0                    # paired gate/up tiles: the up rows' offset
    steps: list = field(default_factory=list)     # (epilogue step, its tensor or None)
    out: Value | None = None
    absorbed: list = field(default_factory=list)  # graph ops folded in (not the linear)
    x: Value | None = None            # the activations read, when not the op's x (head views)
    head_cols: int = 0                # block-diagonal (head_linear): x columns per head

    @property
    def heads(self) -> int:
        """Heads of a block-diagonal kernel (``head_linear``), else 0."""
        w = self.linear.operands[1].type
        return w.shape[0] if self.linear.name == "head_linear" else 0

    @property
    def nk(self) -> tuple[int, int]:
        """(N, K) of the weight's 2D row view (``[H, N/H, K]`` is ``[N, K]``)."""
        w = self.linear.operands[1].type
        return math.prod(w.shape[:-1]), w.shape[-1]

    @property
    def head_rows(self) -> int:
        """Weight rows per head (0: not block-diagonal)."""
        return self.linear.operands[1].type.shape[1] if self.heads else 0

    @property
    def xin(self) -> Value:
        """The activations the kernel reads."""
        return self.x if self.x is not None else self.linear.operands[0]


def _only_use(name: str, use: dict, outputs: set) -> Op | None:
    u = use.get(name, [])
    return u[0] if len(u) == 1 and name not in outputs else None


def unfused_ops(g: Graph) -> list[Op]:
    """The ops of graph ``g`` that are no linear, no multi-GPU collective (those run on the
    host between the kernels) and that no v2 kernel absorbs: what ``partition-units`` refuses
    by name, and what sends ``fusionc.compile``'s v2 default to the library path (e.g. an
    elementwise graph without a linear, a norm with other uses)."""
    found = linear_kernels(g)
    folded = {id(o) for k in found for o in k.absorbed + [k.linear]}   # head_linear too
    folded |= {id(k.norm) for k in found if k.norm is not None}
    from fusionc.lower.attention_v2 import attention_cores
    from fusionc.lower.mla_v2 import host_ops, mla_cores
    folded |= {id(o) for c in attention_cores(g) for o in c.absorbed}
    mla = mla_cores(g)
    folded |= {id(o) for c in mla for o in c.absorbed}
    if mla:   # W_UK, W_UV and their views run between the kernels
        folded |= {id(o) for o in host_ops(g)}
    from fusionc.ir.ops.comm import host_collective
    return [op for op in g.body if op.name != "linear" and id(op) not in folded and
            not host_collective(op)]


def linear_kernels(g: Graph) -> list[LinearKernel]:
    """The v2 linear kernels of graph ``g`` (see the module docstring), in program order."""
    use, outputs = users(g), {v.name for v in g.outputs}
    order = {r.name: i for i, op in enumerate(g.body) for r in op.results}
    out = []
    heads = head_kernels(g)
    for i, op in enumerate(g.body):
        if id(op) in heads:
            out.append(heads[id(op)])
        if op.name != "linear":
            continue
        k = LinearKernel(op)
        k.norm = _prologue(g, op, use, outputs)
        cur = op.result
        pair = _pair(cur, use, outputs)
        if pair is not None:
            _round(k, cur)
            k.steps.append(("silu_mul", None))
            k.split, cur = op.operands[1].type.shape[0] // 2, pair[-1].result
            k.absorbed += pair
        while True:
            nxt = _only_use(cur.name, use, outputs)
            step = _epilogue_step(nxt, cur, order, i) if nxt is not None else None
            if step is None:
                break
            name, operand = step
            _round(k, cur)   # the graph rounds every op's result to its dtype
            if name != "cast":
                k.steps.append((name, operand))
            k.absorbed.append(nxt)
            cur = nxt.result
        k.out = cur
        out.append(k)
    return out


def _round(k: LinearKernel, v: Value) -> None:
    """A ``round_*`` step where the graph rounds ``v`` (16-bit) before the next op reads it."""
    if v.type.dtype.value in ("f16", "bf16"):
        k.steps.append((f"round_{v.type.dtype.value}", None))


def _prologue(g: Graph, op: Op, use: dict, outputs: set) -> Op | None:
    x = op.operands[0]
    d = next((o for o in g.body if any(r.name == x.name for r in o.results)), None)
    if d is None or d.name != "rms_norm" or x.name in outputs or d.operands[0].type.rank != 2:
        return None
    if all(u.name == "linear" and u.operands[0].name == x.name for u in use.get(x.name, [])):
        return d
    return None


def _pair(cur: Value, use: dict, outputs: set) -> list[Op] | None:
    """[split, (silu,) silu_mul | mul] when ``cur`` is only split into gate/up for SwiGLU."""
    s = _only_use(cur.name, use, outputs)
    if s is None or s.name != "split" or len(s.results) != 2 or \
            s.attr("axis") % cur.type.rank != cur.type.rank - 1:
        return None
    gate, up = s.results
    if gate.type != up.type or cur.type.rank != 2:
        return None
    ug, uu = _only_use(gate.name, use, outputs), _only_use(up.name, use, outputs)
    if ug is not None and ug is uu and ug.name == "silu_mul" and \
            [v.name for v in ug.operands] == [gate.name, up.name]:
        return [s, ug]
    if ug is not None and ug.name == "silu" and uu is not None and uu.name == "mul":
        act = ug.result
        if _only_use(act.name, use, outputs) is uu and \
                {v.name for v in uu.operands} == {act.name, up.name}:
            return [s, ug, uu]
    return None


def _epilogue_step(nxt: Op, cur: Value, order: dict, at: int):
    """(step, operand) when ``nxt`` can join the flush of the value ``cur``, else None."""
    if nxt.name == "silu":
        return nxt.name, None
    if nxt.name == "cast" and nxt.result.type.dtype in FLOAT_DTYPES:
        return "cast", None
    if nxt.name in ("add", "mul") and len(nxt.operands) == 2:
        a, b = nxt.operands
        other = b if a.name == cur.name else a
        if other.name == cur.name or other.type.shape != cur.type.shape:
            return None
        if other.name in order and order[other.name] >= at:   # computed after the linear
            return None
        return nxt.name, other
    return None


def chains(g: Graph, kernels: list[LinearKernel], chain: bool = True,
           siblings: bool = True) -> list[list[LinearKernel]]:
    """``kernels`` (in program order) cut into chains that share one persistent kernel (see
    the module docstring); every kernel is in exactly one chain. ``chain``: a kernel joins the
    previous one's when it reads its output; ``siblings``: when it reads the same activations
    with the same prologue as every kernel of the chain so far."""
    use, outputs = users(g), {v.name for v in g.outputs}
    order = {r.name: i for i, op in enumerate(g.body) for r in op.results}
    out: list[list[LinearKernel]] = []
    def early(k, c):   # what k reads besides x exists when chain c launches
        at = order[c[0].linear.result.name]
        return all(order.get(t.name, -1) < at for t in _tensors(k))

    for k in kernels:
        if out and chain and early(k, out[-1]) and _chains(out[-1][-1], k, use, outputs):
            out[-1].append(k)
            continue
        same = [c for c in out if all(sibling(a, k) for a in c) and early(k, c)]
        if siblings and same:   # e.g. w_kv_a after w_q_a and w_q_b: with w_q_a
            same[-1].append(k)
        else:
            out.append([k])
    return out


def sibling(a: LinearKernel, b: LinearKernel) -> bool:
    """Whether ``b`` reads what ``a`` reads, with the same RMSNorm prologue (w_q and w_kv_a
    of an MLA block): its phase needs no wait, and the kernel's ``row_rms`` serves both."""
    wa, wb = a.linear.operands[1].type, b.linear.operands[1].type
    return (not a.heads and not b.heads and a.xin.name == b.xin.name and
            a.norm is b.norm and wa.dtype == wb.dtype and _ring(a, b))


def _chains(a: LinearKernel, b: LinearKernel, use: dict, outputs: set) -> bool:
    x = b.linear.operands[0]
    wa, wb = a.linear.operands[1].type, b.linear.operands[1].type
    return (b.norm is None and not b.heads and x.name == a.out.name and x.name not in outputs and
            len(use.get(x.name, [])) == 1 and _ring(a, b) and
            wa.dtype == wb.dtype == x.type.dtype)


def _ring(a: LinearKernel, b: LinearKernel) -> bool:
    """Both stream their weight tiles through the ring (static rows TMA copies)."""
    return all(w.is_static and tma_rows(w.shape[-1], w.dtype.itemsize)
               for w in (k.linear.operands[1].type for k in (a, b)))


def _tensors(k: LinearKernel) -> list[Value]:
    """What a kernel reads besides its x: weight, bias, epilogue operands."""
    return list(k.linear.operands[1:]) + [t for _, t in k.steps if t is not None]


def head_kernels(g: Graph) -> dict[int, LinearKernel]:
    """The ``head_linear`` ops of graph ``g`` that run as block-diagonal v2 linear kernels
    (:mod:`fusionc.lower.match_heads`), by op id."""
    from fusionc.lower.match_heads import head_kernels as found
    return found(g)
