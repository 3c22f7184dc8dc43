"""Tile IR: cluster collectives over distributed shared memory (ClusterFusion, arXiv 2508.18850,
§3: ClusterReduce and ClusterGather).

Both read the *same* shared-memory buffer of every CTA of the cluster (the only way peers' shared
memory is reached), so the buffer must have been written in an earlier barrier phase and must not
be overwritten, nor its CTA exit, before the next ``cluster_barrier`` (``fusionc.sim.state``).

``cluster_reduce(%buf) {op = sum|max, masks = [...]} : type``
    Every CTA receives the reduction of all CTAs' buffers, in fp32 then rounded to the result
    dtype. Order (fixed, so every CTA gets the same bits): recursive doubling over the xor masks
    in ``masks`` — at each step a CTA combines its value with that of rank ``rank ^ mask``, lower
    rank on the left. ``masks = []`` means the default pairwise tree ``[1, 2, 4, ..., C/2]``
    (an all-read implementation must add in that tree order). A schedule that does not combine
    every rank exactly once is an error.
``cluster_gather(%buf) {axis} : type``
    Every CTA receives the concatenation of all CTAs' buffers along ``axis``, in rank order.
"""

from __future__ import annotations

import numpy as np

from fusionc.errors import SimulationError
from fusionc.interp.numerics import round_to
from fusionc.ir.ops.tile_memory import K, buffer_of
from fusionc.ir.registry import INT, INTS, Cost, OpDef, attr, enum, fail, register


def read_peers(op, ctas) -> list[np.ndarray]:
    """Every CTA's copy of the operand buffer, checking the phase rules."""
    name = op.operands[0].name
    out = []
    for c in ctas:
        buf = c.values[name]
        if buf.written_phase is None:
            raise SimulationError(
                f"CTA {c.rank} never stored into %{name} before this collective",
                op=op.name,
                loc=op.loc,
                valid="smem_store, cluster_barrier, then the collective",
            )
        if buf.written_phase == c.phase:
            raise SimulationError(
                f"reads %{name} of CTA {c.rank}, written in the same barrier phase: no "
                "cluster_barrier makes it visible",
                op=op.name,
                loc=op.loc,
                valid="a cluster_barrier() between smem_store and the collective",
            )
        if len(ctas) > 1:
            buf.peer_read_phase, buf.peer_read_by = c.phase, op
        out.append(buf.data.astype(np.float32))
    return out


def default_masks(size: int) -> tuple[int, ...]:
    """The pairwise-tree schedule [1, 2, 4, ..., size/2]."""
    return tuple(1 << i for i in range(size.bit_length() - 1))


def butterfly(vals: list, masks, combine) -> list:
    """Recursive doubling over xor ``masks`` (``[]``: the pairwise tree): at each step rank r
    combines with rank r ^ mask, lower rank on the left, ``combine(a, b)``. Returns every rank's
    final value. The one definition of the order: the simulator runs it on arrays, codegen on C
    expressions. Raises ValueError when a mask names no partner or the schedule leaves a rank
    without every contribution exactly once."""
    size = len(vals)
    masks = tuple(masks) or default_masks(size)
    count = [[int(r == q) for q in range(size)] for r in range(size)]
    for m in masks:
        if not 0 < m < size:
            raise ValueError(f"mask {m} names no partner in a cluster of {size}")
        vals = [combine(vals[min(r, r ^ m)], vals[max(r, r ^ m)]) for r in range(size)]
        count = [[a + b for a, b in zip(count[r], count[r ^ m])] for r in range(size)]
    for r, c in enumerate(count):
        if c != [1] * size:
            raise ValueError(f"wrong reduction partners: masks {list(masks)} leave CTA {r} "
                             f"with contributions {c} (each rank must count once)")
    return vals


def _reduce_values(op, vals: list[np.ndarray]) -> list[np.ndarray]:
    fn = np.add if op.attr("op") == "sum" else np.maximum
    try:
        return butterfly(vals, op.attr("masks"), fn)
    except ValueError as e:
        raise SimulationError(str(e), op=op.name, loc=op.loc,
                              valid=f"each of {list(default_masks(len(vals)))} once, in any "
                                    "order") from None


def _sim_reduce(op, ctas):
    vals = _reduce_values(op, read_peers(op, ctas))
    dt = op.result.type.dtype
    return [(round_to(v, dt),) for v in vals]


def _infer_reduce(op):
    return (op.operands[0].type,)


def _verify_masks(op, graph, module):
    buffer_of(op, graph, op.operands[0])
    if graph is None:
        return
    size = graph.attr("cluster")
    masks = op.attr("masks")
    if masks and sorted(masks) != list(default_masks(size)):
        fail(
            op,
            f"masks {list(masks)} do not combine every rank of a cluster of {size} once",
            f"a permutation of {list(default_masks(size))}, or [] for the default",
        )


def _sim_gather(op, ctas):
    vals = read_peers(op, ctas)
    out = round_to(np.concatenate(vals, axis=op.attr("axis") % vals[0].ndim), op.result.type.dtype)
    return [(out.copy(),) for _ in ctas]


def _infer_gather(op):
    t = op.operands[0].type
    if len(op.results) != 1:
        fail(op, "cluster_gather has one result")
    axis = op.attr("axis")
    if not -t.rank <= axis < t.rank:
        fail(op, f"axis {axis} out of range for {t}", f"-{t.rank} <= axis < {t.rank}")
    axis %= t.rank
    got = op.results[0].type
    n = got.shape[axis] if got.rank == t.rank else None
    if not isinstance(t.shape[axis], int) or not isinstance(n, int) or n % t.shape[axis]:
        fail(
            op,
            f"result {got} is not buffers {t} concatenated along axis {axis}",
            f"dim {axis} a multiple (the cluster size) of {t.shape[axis]}",
        )
    return (t.with_shape(t.shape[:axis] + (n,) + t.shape[axis + 1 :]),)


def _verify_gather(op, graph, module):
    buffer_of(op, graph, op.operands[0])
    if graph is None:
        return
    t, got = op.operands[0].type, op.result.type
    axis = op.attr("axis") % t.rank
    if got.shape[axis] != t.shape[axis] * graph.attr("cluster"):
        fail(
            op,
            f"result {got} is not {graph.attr('cluster')} buffers {t} along axis {axis}",
            f"dim {axis} = {t.shape[axis]} x cluster size",
        )


def _cost_dsm(op, env):
    """Each CTA reads the buffers of its C - 1 peers."""
    return Cost(dsm_bytes=(env.get("C", 1) - 1) * op.operands[0].type.nbytes(env))


register(
    OpDef(
        "cluster_reduce",
        __doc__,
        ("buffer",),
        (
            attr("op", enum("sum", "max")),
            attr("masks", INTS, (), doc="recursive-doubling xor masks; [] = pairwise tree"),
        ),
        _infer_reduce,
        where=K,
        simulate=_sim_reduce,
        verify=_verify_masks,
        collective=True,
        cost=_cost_dsm,
    )
)
register(
    OpDef(
        "cluster_gather",
        __doc__,
        ("buffer",),
        (attr("axis", INT, 0),),
        _infer_gather,
        where=K,
        simulate=_sim_gather,
        verify=_verify_gather,
        collective=True,
        cost=_cost_dsm,
    )
)
