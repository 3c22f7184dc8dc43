"""Static plan of a grid_reduce: which CTAs contribute to which output window.

A CTA reaches the op unless a ``when`` it is not selected by, or an ``exit`` before it, keeps
it away (both are decided by the static cluster id and rank). CTAs whose offsets give the same
tile form one *window*; windows must be identical or disjoint (partial overlaps would need a
per-element contributor list), which is checked here.
"""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.errors import CompileError
from fusionc.ir.nodes import Graph, Op


@dataclass(frozen=True)
class GridReducePlan:
    """``window[gid]``: window index of each CTA (-1 if it does not contribute);
    ``members[w]``: the contributing CTAs of window w, in CTA order (cluster-major)."""

    window: tuple[int, ...]
    members: tuple[tuple[int, ...], ...]


def _reaches(ops, target: Op, cluster: int, rank: int):
    """True/False once decided in ``ops``; None if ``ops`` neither hold the target nor exit."""
    for op in ops:
        if op is target:
            return True
        if op.name == "exit":
            return False
        if op.name == "when":
            coord = rank if op.attr("on") == "rank" else cluster
            if op.attr("lo") <= coord < op.attr("hi"):
                res = _reaches(op.regions[0], target, cluster, rank)
                if res is not None:
                    return res
    return None


def plan_grid_reduce(kernel: Graph, op: Op) -> GridReducePlan:
    """Windows and contributors of ``op``. Raises CompileError on partially overlapping
    windows."""
    grid, size = kernel.attr("grid"), kernel.attr("cluster")
    tile = op.operands[1].type.shape
    wins: dict[tuple, list[int]] = {}
    window = []
    for gid in range(grid * size):
        c, r = divmod(gid, size)
        if not _reaches(kernel.body, op, c, r):
            window.append(-1)
            continue
        key = tuple(a(c, r) for a in op.attr("offsets"))
        wins.setdefault(key, []).append(gid)
        window.append(list(wins).index(key))
    keys = list(wins)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if not any(isinstance(n, int) and abs(x - y) >= n for x, y, n in zip(a, b, tile)):
                raise CompileError(
                    f"output windows at offsets {list(a)} and {list(b)} of tile "
                    f"{list(tile)} partially overlap", op=op.name, loc=op.loc,
                    valid="grid_reduce tiles that are identical or disjoint across CTAs")
    return GridReducePlan(tuple(window), tuple(tuple(wins[k]) for k in keys))
