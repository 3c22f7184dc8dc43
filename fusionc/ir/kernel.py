"""The ``kernel`` item kind: a tile-IR cluster kernel and its launch-shape rules.

``kernel @k {grid = G, cluster = C, threads = T, max_batch = 16, nonportable = false}
(%params) { per-CTA ops; return %outputs }``: G clusters of C CTAs of T threads each. Every CTA
runs the body with its own ``cluster`` in [0, G) and ``rank`` in [0, C). Parameters are global
tensors; the returned ones are the kernel's outputs (written in place).

Invariants checked here (docs/ARCHITECTURE.md, IR rules):
- C ∈ {1, 2, 4, 8, 16}; 16 only with ``nonportable = true`` (the non-portable cluster size
  attribute must be set on the function before launch);
- T a multiple of 32 (whole warps), at most 1024;
- shared memory per CTA (the sum of ``smem_alloc`` buffers, symbolic dims bound to
  ``max_batch``) at most 227 KB, the H200's opt-in limit per block;
- every collective (and every ``grid_reduce``, whose arrival counter waits for all CTAs) is
  reached by all CTAs of a cluster: none inside a ``when`` on the rank, and none after a
  rank-dependent ``exit``;
- the barrier discipline of shared memory read by peers (see ``_check_barriers``);
- tiles read or written stay inside their tensors for every (cluster, rank) unless masked.
"""
from __future__ import annotations

import math

from fusionc.errors import VerifyError
from fusionc.ir.nodes import Graph, Module, Op
from fusionc.ir.registry import BOOL, POS_INT, FuncKind, attr, lookup, register_func_kind

SMEM_LIMIT = 227 * 1024
CLUSTER_SIZES = (1, 2, 4, 8, 16)


def smem_bytes(kernel: Graph) -> int:
    """Shared memory per CTA in bytes, symbolic dims bound to the kernel's ``max_batch``."""
    b = kernel.attr("max_batch")
    total = 0
    for op in kernel.walk():
        if op.name == "smem_alloc":
            t = op.result.type
            total += t.nbytes({d: b for d in t.shape if isinstance(d, str)})
        elif op.name == "ring_alloc":
            total += ring_geometry(op).total_bytes
    return total


def ring_geometry(op: Op):
    """The :class:`fusionc.stream.RingGeometry` of a ``ring_alloc`` op."""
    from fusionc.stream.ring import RingGeometry
    s, rows_all, cols = op.result.type.shape
    rows = op.attr("rows")
    return RingGeometry(s, rows, rows_all - rows, cols, op.result.type.dtype.itemsize)


def _verify(k: Graph, module: Module | None) -> None:
    c, t = k.attr("cluster"), k.attr("threads")
    if c not in CLUSTER_SIZES:
        raise VerifyError(f"cluster size {c}", op=k.name, loc=k.loc,
                          valid="1, 2, 4, 8 or 16 CTAs per cluster")
    if c == 16 and not k.attr("nonportable"):
        raise VerifyError("cluster size 16 needs the non-portable cluster size attribute",
                          op=k.name, loc=k.loc, valid="nonportable = true, or cluster <= 8")
    if t % 32 or t > 1024:
        raise VerifyError(f"{t} threads per CTA", op=k.name, loc=k.loc,
                          valid="a multiple of 32, at most 1024")
    smem = smem_bytes(k)
    if smem > SMEM_LIMIT:
        raise VerifyError(f"{smem} bytes of shared memory per CTA", op=k.name, loc=k.loc,
                          valid=f"at most {SMEM_LIMIT} bytes (227 KB)")
    names = {p.name for p in k.params}
    for v in k.outputs:
        if v.name not in names:
            raise VerifyError(f"returns %{v.name}, which is not a parameter", op=k.name,
                              loc=k.loc, valid="a kernel returns the parameters it writes")
    _check_collectives(k.body, rank_branch=None, exited=None)
    _check_barriers(k)
    _walk_bounds(k.body, k, (0, k.attr("grid")), (0, k.attr("cluster")))


def _walk_bounds(ops, k: Graph, clusters: tuple[int, int], ranks: tuple[int, int]) -> None:
    """_check_bounds on every op, over the clusters and ranks that reach it (``when``)."""
    for op in ops:
        if op.name == "when":
            lo, hi = op.attr("lo"), op.attr("hi")
            c, r = clusters, ranks
            if op.attr("on") == "cluster":
                c = (max(lo, c[0]), min(hi, c[1]))
            else:
                r = (max(lo, r[0]), min(hi, r[1]))
            if c[0] < c[1] and r[0] < r[1]:
                _walk_bounds(op.regions[0], k, c, r)
            continue
        _check_bounds(op, k, clusters, ranks)


def _check_barriers(k: Graph) -> None:
    """The barrier discipline of distributed shared memory, statically (the simulator checks
    it dynamically): within one barrier phase a buffer is written by its owner or read by peers
    through a collective, never both, and no CTA exits while peers may read its buffers."""
    written: dict[str, Op] = {}   # stored in this phase
    read: dict[str, Op] = {}      # read by a collective in this phase
    stored: set[str] = set()
    for op in k.walk():
        if op.name in ("cluster_barrier", "grid_barrier"):
            written.clear()
            read.clear()
        elif op.name == "smem_store":
            buf = op.operands[0].name
            if buf in read:
                raise VerifyError(f"overwrites %{buf} while peers may still read it (read by "
                                  f"'{read[buf].name}' at {read[buf].loc})", op=op.name,
                                  loc=op.loc, valid="a cluster_barrier() between the "
                                  "collective and the next store")
            written[buf] = op
            stored.add(buf)
        elif lookup(op.name) is not None and lookup(op.name).collective:
            buf = op.operands[0].name
            if buf not in stored:
                raise VerifyError(f"%{buf} is never stored before this collective",
                                  op=op.name, loc=op.loc, valid="smem_store, cluster_barrier, "
                                  "then the collective")
            if buf in written:
                raise VerifyError(f"reads %{buf}, stored at {written[buf].loc} in the same "
                                  "barrier phase: no cluster_barrier makes it visible",
                                  op=op.name, loc=op.loc,
                                  valid="a cluster_barrier() between smem_store and the "
                                        "collective")
            read[buf] = op
        elif op.name == "exit" and read:
            _exit_error(op, read)
    if read:
        _exit_error(None, read, k)


def _exit_error(op: Op | None, read: dict, k: Graph | None = None) -> None:
    buf, by = next(iter(read.items()))
    raise VerifyError(f"a CTA may exit while peers still read its shared memory %{buf} "
                      f"(read by '{by.name}' at {by.loc})", op=op.name if op else k.name,
                      loc=op.loc if op else by.loc,
                      valid="a cluster_barrier() after the last collective, before any exit")


def _extremes(a, clusters: tuple[int, int], ranks: tuple[int, int]) -> tuple[int, int]:
    """Smallest and largest value of affine ``a`` over the (cluster, rank) ranges."""
    vals = [a(c, r) for c in (clusters[0], clusters[1] - 1) for r in (ranks[0], ranks[1] - 1)]
    return min(vals), max(vals)


def _check_bounds(op: Op, k: Graph, clusters: tuple[int, int], ranks: tuple[int, int]) -> None:
    """Static check that unmasked tiles stay inside their tensors (static dims only), over the
    CTAs with cluster id in ``clusters`` and rank in ``ranks`` (half-open ranges)."""
    if op.name in ("load", "store", "grid_reduce"):
        if op.name != "grid_reduce" and op.attr("masked"):
            return
        g = op.operands[0].type
        sizes = op.result.type.shape if op.name == "load" else op.operands[1].type.shape
        pairs = zip(op.attr("offsets"), sizes, g.shape)
    elif op.name == "gemv" and not op.attr("masked"):
        w = op.operands[1].type
        n_rows = w.shape[0] if w.rank == 2 else math.prod(w.shape[:-1])  # [heads, N, K] flat
        pairs = ((op.attr("row"), op.attr("rows"), n_rows),
                 (op.attr("col"), op.operands[0].type.shape[-1], w.shape[-1]))
    else:
        return
    for axis, (off, n, dim) in enumerate(pairs):
        if not (isinstance(n, int) and isinstance(dim, int)):
            if str(off) != "0" or n != dim:
                raise VerifyError(f"axis {axis}: a symbolic size {n} at offset \"{off}\"",
                                  op=op.name, loc=op.loc, valid="the whole symbolic dim at 0")
            continue
        lo, hi = _extremes(off, clusters, ranks)
        if lo < 0 or hi + n > dim:
            raise VerifyError(
                f"axis {axis}: tile [{off}, +{n}) reaches {lo}..{hi + n} over the grid, outside "
                f"0..{dim}", op=op.name, loc=op.loc, valid="tiles inside the tensor, or masked")


def _check_collectives(ops, rank_branch: Op | None, exited: Op | None) -> Op | None:
    """Walk ops in order; returns a rank-dependent exit seen (if any)."""
    for op in ops:
        d = lookup(op.name)
        if d is not None and (d.collective or op.name == "grid_reduce"):
            culprit = rank_branch or exited
            if culprit is not None:
                why = ("inside a branch on the CTA rank" if rank_branch is not None else
                       f"after a rank-dependent exit at {exited.loc}")
                raise VerifyError(f"collective {why}: not every CTA of the cluster reaches it "
                                  f"(branch at {culprit.loc})", op=op.name, loc=op.loc,
                                  valid="collectives outside rank-dependent branches")
        if op.name == "exit" and rank_branch is not None:
            exited = exited or rank_branch
        if op.name == "when":
            on_rank = op.attr("on") == "rank"
            inner = _check_collectives(op.regions[0], rank_branch or (op if on_rank else None),
                                       exited)
            exited = exited or inner
    return exited


register_func_kind(FuncKind(
    "kernel",
    (attr("grid", POS_INT, doc="number of clusters"),
     attr("cluster", POS_INT, doc="CTAs per cluster"),
     attr("threads", POS_INT, 128, doc="threads per CTA"),
     attr("max_batch", POS_INT, 1, doc="largest value of symbolic dims (batch bucket)"),
     attr("nonportable", BOOL, False, doc="allow cluster size 16")),
    _verify))
