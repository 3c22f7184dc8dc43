"""Tile program of a fused SwiGLU MLP block: x + down(silu(gate(h)) · up(h)), h = RMSNorm(x).

The intermediate dimension I is split over all CTAs of the grid: CTA (g, r) owns R = I / (G·C)
rows of gate and up (``grid`` clusters G of C CTAs). Per CTA:
1. RMSNorm of all of x (replicated: x is B·hidden elements, read from L2), then its R rows of
   gate and up over all of K, and act = silu(gate) · up — no collective needed;
2. ``cluster_gather`` of act over the cluster (B·C·R elements over DSM) so every CTA holds the
   cluster's C·R activations;
3. down projection split-N across the cluster: CTA r computes hidden/C output rows over the
   cluster's C·R columns; the clusters' partial sums meet in a deterministic ``grid_reduce``
   that starts from the residual.
Why not split-K ``cluster_reduce`` for the down projection: it moves B·hidden·4 bytes per CTA over
DSM (16 KB at batch 1, ~13 µs per round at C=4 by the anchors) against B·C·R·2 for the gather.
One kernel: the only cross-cluster dependency (the sum over I) goes through grid_reduce.

Scheme ``splitk`` (for large batches, where all of x and h no longer fit in shared memory): cluster
g owns Rc = I / G rows of gate and up; CTA r normalizes only its slice of x (the sum of squares by
``cluster_reduce``) and computes the partial gate and up over that K slice; one ``cluster_reduce``
of the packed partials gives every CTA the cluster's activations; the down projection is then as
above. The scheme of the first paragraphs is ``splitn``.
"""
from __future__ import annotations

from fusionc.errors import LoweringError
from fusionc.ir.nodes import Graph
from fusionc.lower.builder import KernelBuilder
from fusionc.lower.collectives import all_gather, all_reduce, project_and_sum
from fusionc.lower.match import MLPStage


def lower_mlp(st: MLPStage, name: str, size: int, grid: int, max_batch: int,
              scheme: str = "splitn", threads: int = 256) -> Graph:
    """The kernel for ``st``: ``grid`` clusters of ``size`` CTAs, scheme splitn or splitk."""
    if scheme == "splitk":
        return _lower_splitk(st, name, size, grid, max_batch, threads)
    B, hidden = st.x.type.shape
    inter = st.gate.rows
    ctas = grid * size
    if inter % ctas or hidden % size or st.down.type.shape != (hidden, inter):
        raise LoweringError(f"intermediate {inter} over {ctas} CTAs, hidden {hidden} over "
                            f"clusters of {size}", op="silu_mul", loc=st.ops[0].loc,
                            valid="grid x cluster dividing the intermediate size and the "
                                  "cluster size dividing hidden")
    R = inter // ctas
    b = KernelBuilder(name, st.ops[0].loc)
    x = b.op("load", b.param(st.x), offsets=["0", "0"], sizes=[B, hidden], hint="x")
    if st.norm is not None:
        w = b.op("load", b.param(st.norm.weight), offsets=["0"], sizes=[hidden], hint="wn")
        x = b.op("rms_norm", x, w, eps=st.norm.eps, hint="h", loc=st.norm.loc)
    dt = str(st.x.type.dtype)
    rows = f"{R * size}*cluster + {R}*rank"
    gate = b.op("gemv", x, b.param(st.gate.weight), row=f"{st.gate.row0} + {rows}", col="0",
                rows=R, hint="g", loc=st.gate.loc)
    up = b.op("gemv", x, b.param(st.up.weight), row=f"{st.up.row0} + {rows}", col="0",
              rows=R, hint="u", loc=st.up.loc)
    act = b.op("silu_mul", b.op("cast", gate, dtype=dt, hint="g16"),
               b.op("cast", up, dtype=dt, hint="u16"), hint="act")
    if size > 1:
        act = all_gather(b, act, axis=1, size=size, hint="act_g")
    project_and_sum(b, act, st.down, b.output(st.out, pure=True), st.residual, size,
                    f"{R * size}*cluster")
    return b.build(grid=grid, cluster=size, threads=threads, max_batch=max_batch)


def _lower_splitk(st: MLPStage, name: str, size: int, grid: int, max_batch: int,
                  threads: int) -> Graph:
    B, hidden = st.x.type.shape
    inter = st.gate.rows
    if inter % grid or hidden % size or st.down.type.shape != (hidden, inter):
        raise LoweringError(f"intermediate {inter} over {grid} clusters, hidden {hidden} over "
                            f"clusters of {size}", op="silu_mul", loc=st.ops[0].loc,
                            valid="grid dividing the intermediate size and the cluster size "
                                  "dividing hidden")
    rc, ks = inter // grid, hidden // size
    b = KernelBuilder(name, st.ops[0].loc)
    x = b.op("load", b.param(st.x), offsets=["0", f"{ks}*rank"], sizes=[B, ks], hint="x")
    if st.norm is not None:
        ss = b.op("reduce", x, op="sumsq", axis=-1, hint="ss")
        ss = all_reduce(b, ss, "sum", hint="ss_sum") if size > 1 else ss
        w = b.op("load", b.param(st.norm.weight), offsets=[f"{ks}*rank"], sizes=[ks], hint="wn")
        x = b.op("norm_apply", x, w, ss, eps=st.norm.eps, dim=hidden, hint="h",
                 loc=st.norm.loc)
    parts = [b.op("gemv", x, b.param(p.weight), row=f"{p.row0} + {rc}*cluster",
                  col=f"{ks}*rank", rows=rc, hint="p", loc=p.loc) for p in (st.gate, st.up)]
    pack = b.op("concat", *parts, axis=-1, hint="gu_part")
    pack = all_reduce(b, pack, "sum", hint="gu") if size > 1 else pack
    dt = str(st.x.type.dtype)
    gate, up = b.op("split", b.op("cast", pack, dtype=dt, hint="gu16"), axis=-1,
                    sizes=[rc, rc], hint="s")
    act = b.op("silu_mul", gate, up, hint="act")
    project_and_sum(b, act, st.down, b.output(st.out, pure=True), st.residual, size,
                    f"{rc}*cluster")
    return b.build(grid=grid, cluster=size, threads=threads, max_batch=max_batch)
