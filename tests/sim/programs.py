"""Tile programs used by the simulator tests, written as IR text (so they also test the parser)."""

from __future__ import annotations


def collective_kernel(
    kind: str,
    size: int,
    grid: int,
    shape: tuple[int, ...],
    dtype: str,
    masks: tuple[int, ...] = (),
    axis: int = 0,
) -> str:
    """Each CTA loads its payload ``x[cluster*size + rank]`` (of ``shape``), runs one collective
    and stores its result at ``y[cluster*size + rank]``."""
    out_dtype = dtype
    dims = ", ".join(map(str, shape))
    zeros = ", ".join(['"0"'] * len(shape))
    n = grid * size
    if kind == "gather":
        oshape = list(shape)
        oshape[axis] *= size
        odims = ", ".join(map(str, oshape))
        coll = f"cluster_gather(%buf) {{axis = {axis + 1}}} : {out_dtype}[1, {odims}]"
    else:
        odims = dims
        coll = (
            f"cluster_reduce(%buf) {{op = {kind}, masks = [{', '.join(map(str, masks))}]}} "
            f": {out_dtype}[1, {odims}]"
        )
    big = "nonportable = true, " if size == 16 else ""
    return f"""
kernel @coll {{grid = {grid}, cluster = {size}, {big}threads = 128}} (%x: {dtype}[{n}, {dims}], %y: {out_dtype}[{n}, {odims}]) {{
  %p = load(%x) {{offsets = ["{size}*cluster + rank", {zeros}], sizes = [1, {dims}]}} : {dtype}[1, {dims}]
  %buf = smem_alloc() : {dtype}[1, {dims}]
  smem_store(%buf, %p)
  cluster_barrier()
  %r = {coll}
  cluster_barrier()
  store(%y, %r) {{offsets = ["{size}*cluster + rank", {zeros}]}}
  return %y
}}
"""


def splitk_gemv(
    size: int,
    grid: int,
    k_tile: int,
    n_tile: int,
    dtype: str,
    batch: str = "B",
    scheme: str = "splitk",
) -> str:
    """y = x @ w.T with w: [grid*n_tile, size*k_tile]: split-K over the cluster and
    cluster_reduce (``splitk``), or split-N over the cluster and cluster_gather (``gather``)."""
    big = "nonportable = true, " if size == 16 else ""
    head = f"kernel @gemv {{grid = {grid}, cluster = {size}, {big}max_batch = 8}}"
    k, n = size * k_tile, grid * n_tile
    if scheme == "splitk":
        body = f"""
  %xt = load(%x) {{offsets = ["0", "{k_tile}*rank"], sizes = [{batch}, {k_tile}]}} : {dtype}[{batch}, {k_tile}]
  %p = gemv(%xt, %w) {{row = "{n_tile}*cluster", col = "{k_tile}*rank", rows = {n_tile}}} : f32[{batch}, {n_tile}]
  %buf = smem_alloc() : f32[{batch}, {n_tile}]
  smem_store(%buf, %p)
  cluster_barrier()
  %s = cluster_reduce(%buf) {{op = sum}} : f32[{batch}, {n_tile}]
  cluster_barrier()
  when() {{on = rank, lo = 0, hi = 1}} ({{
    store(%y, %s) {{offsets = ["0", "{n_tile}*cluster"]}}
  }})"""
    else:
        sub = n_tile // size
        body = f"""
  %xt = load(%x) {{offsets = ["0", "0"], sizes = [{batch}, {k}]}} : {dtype}[{batch}, {k}]
  %p = gemv(%xt, %w) {{row = "{n_tile}*cluster + {sub}*rank", col = "0", rows = {sub}}} : f32[{batch}, {sub}]
  %buf = smem_alloc() : f32[{batch}, {sub}]
  smem_store(%buf, %p)
  cluster_barrier()
  %g = cluster_gather(%buf) {{axis = 1}} : f32[{batch}, {n_tile}]
  cluster_barrier()
  when() {{on = rank, lo = {size - 1}, hi = {size}}} ({{
    store(%y, %g) {{offsets = ["0", "{n_tile}*cluster"]}}
  }})"""
    return f"""{head} (%x: {dtype}[{batch}, {k}], %w: {dtype}[{n}, {k}], %y: {dtype}[{batch}, {n}]) {{{body}
  return %y
}}
"""
