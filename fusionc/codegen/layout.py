"""Shared-memory layout of a kernel: every SSA tile value, every ``smem_alloc`` buffer and every
op's scratch space gets a byte offset in the CTA's dynamic shared memory.

Rules:
- kernel parameters live in global memory and get no space;
- ``smem_alloc`` buffers (which peers read over DSM: cluster_reduce, cluster_gather; no op
  writes a peer's shared memory) live from their ``smem_alloc`` to the first top-level
  ``cluster_barrier`` after their last use, when that op and every use are top-level ops: every
  peer has finished reading before it arrives there. Otherwise (a use inside a region, no
  barrier after) they live for the whole kernel;
- other values live from their defining op to their last use (program order, regions
  flattened), so two values whose live ranges do not overlap may share bytes;
- a view op (``reshape``) shares its operand's space and extends its live range;
- sizes bind symbolic dims to the kernel's ``max_batch``; every offset is 16-byte aligned.

Placement is first-fit, whole-kernel buffers first, then by start of live range or by size
(the smaller total wins; Gergov 1999-style interval packing; optimal packing is NP-hard,
first-fit is within a small factor in practice).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fusionc.ir.nodes import Graph, Op

ALIGN = 16


def _round_up(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


@dataclass
class Interval:
    """One allocation: a name, its size and the op indices [start, end] where it is live."""

    name: str
    size: int
    start: int
    end: int
    what: str = "value"
    offset: int = -1


@dataclass
class SmemPlan:
    """Byte offsets of values (by SSA name) and scratch areas (by op index)."""

    offsets: dict[str, int] = field(default_factory=dict)
    scratch: dict[int, tuple[int, int]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)  # view name -> root name
    intervals: list[Interval] = field(default_factory=list)
    total: int = 0

    def root(self, name: str) -> str:
        """The value whose storage ``name`` uses (itself unless it is a view)."""
        while name in self.aliases:
            name = self.aliases[name]
        return name


def flatten(kernel: Graph) -> list[Op]:
    """Every op of the kernel in program order, nested region ops after their parent."""
    return list(kernel.walk())


def plan_smem(kernel: Graph, scratch_bytes, is_view) -> SmemPlan:
    """Assign shared-memory offsets.

    Args:
        kernel: a tile-IR kernel.
        scratch_bytes: ``(op) -> int``: bytes of scratch the op's code needs while it runs.
        is_view: ``(op) -> bool``: the op's single result aliases its first operand.
    Returns:
        The plan; ``total`` is the dynamic shared memory in bytes.
    """
    ops = flatten(kernel)
    mb = kernel.attr("max_batch")
    params = {p.name for p in kernel.params}
    plan = SmemPlan()
    index, last = _def_and_last_use(ops)
    for i, op in enumerate(ops):
        if is_view(op) and op.operands:
            plan.aliases[op.result.name] = op.operands[0].name
    groups: dict[str, Interval] = {}
    buffer_end = _buffer_ends(kernel, ops, plan)
    for i, op in enumerate(ops):
        for r in op.results:
            root = plan.root(r.name)
            if root in params or r.name in plan.aliases:
                continue
            size = _round_up(r.type.nbytes({d: mb for d in r.type.shape if isinstance(d, str)}))
            if op.name == "smem_alloc":
                end = buffer_end.get(root)
                groups[root] = (Interval(root, size, i, end, "dsm buffer") if end is not None
                                else Interval(root, size, 0, len(ops), "buffer"))
            else:
                groups[root] = Interval(root, size, i, max(i, last.get(r.name, i)))
        n = scratch_bytes(op)
        if n:
            groups[f"#scratch{i}"] = Interval(f"scratch of {op.name} (op {i})", _round_up(n),
                                              i, i, "scratch")
    for view, src in plan.aliases.items():  # a view keeps its root alive
        root = plan.root(src)
        if root in groups:
            groups[root].end = max(groups[root].end, last.get(view, index.get(view, 0)))
    _place(list(groups.values()))
    for key, iv in groups.items():
        if key.startswith("#scratch"):
            plan.scratch[int(key[8:])] = (iv.offset, iv.size)
        else:
            plan.offsets[key] = iv.offset
    plan.intervals = sorted(groups.values(), key=lambda iv: (iv.offset, iv.start))
    plan.total = max((iv.offset + iv.size for iv in groups.values()), default=0)
    return plan


def _buffer_ends(kernel: Graph, ops: list[Op], plan: SmemPlan) -> dict[str, int]:
    """Index of the top-level ``cluster_barrier`` that frees each ``smem_alloc`` buffer whose
    allocation and uses (views included) are all top-level ops; buffers not in the result live
    for the whole kernel."""
    top = {id(op) for op in kernel.body}
    barriers = [i for i, op in enumerate(ops) if op.name == "cluster_barrier" and id(op) in top]
    users: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        for r in op.results:
            if op.name == "smem_alloc":
                users[r.name] = [i]
        for v in op.operands:
            root = plan.root(v.name)
            if root in users:
                users[root].append(i)
    ends = {}
    for name, idx in users.items():
        if all(id(ops[i]) in top for i in idx):
            after = [b for b in barriers if b > max(idx)]
            if after:
                ends[name] = after[0]
    return ends


def _def_and_last_use(ops: list[Op]) -> tuple[dict[str, int], dict[str, int]]:
    defined, last = {}, {}
    for i, op in enumerate(ops):
        for v in op.operands:
            last[v.name] = i
        for r in op.results:
            defined[r.name] = i
    return defined, last


def _place(items: list[Interval]) -> None:
    """First-fit in two orders (by start of live range; by size, largest first), whole-kernel
    buffers first in both (they never free their bytes: at the bottom they fragment nothing);
    keeps the smaller total."""
    best = None
    for key in (lambda x: (x.what != "buffer", x.start, -x.size),
                lambda x: (x.what != "buffer", -x.size, x.start)):
        _first_fit(sorted(items, key=key))
        total = max((iv.offset + iv.size for iv in items), default=0)
        if best is None or total < best[0]:
            best = (total, [iv.offset for iv in items])
    for iv, off in zip(items, best[1]):
        iv.offset = off


def _first_fit(items: list[Interval]) -> None:
    placed: list[Interval] = []
    for iv in items:
        busy = sorted((p.offset, p.offset + p.size) for p in placed
                      if not (p.end < iv.start or iv.end < p.start))
        off = 0
        for lo, hi in busy:
            if off + iv.size <= lo:
                break
            off = max(off, _round_up(hi))
        iv.offset = off
        placed.append(iv)
