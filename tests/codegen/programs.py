"""Tile programs for the code generation and GPU tests, as IR text (beside tests/sim/programs.py).

- :func:`attention_kernel` — split-KV decode attention of one KV head per cluster, the CTAs of
  a cluster taking one KV chunk each, merged with two ClusterReduces; rank 0 appends the new
  token to the caches and stores the output.
- :func:`masked_gemv` — split-K GEMV with K and N tails (masked loads, gemv and store).
- :func:`grid_sum` / :func:`oproj_kernel` — grid_reduce of loaded tiles (bit-exact order) and
  of gemv partials summed over clusters (the output projection pattern).
- :func:`graph_ops_kernel` / :func:`graph_ops_graph` — graph ops inside a kernel, and the same
  ops as a graph for the interpreter.
"""

from __future__ import annotations


def _big(size: int) -> str:
    return "nonportable = true, " if size == 16 else ""


def attention_kernel(
    heads: int = 2,
    group: int = 2,
    head_dim: int = 128,
    cluster: int = 4,
    max_seq: int = 300,
    dtype: str = "f16",
    max_batch: int = 4,
    tile: int = 16,
    append: bool = True,
) -> str:
    """q: [B, heads*group, D]; caches [B, S, heads, D]; y: [B, heads*group, D]."""
    g, d, h, c, s, dt = group, head_dim, heads, cluster, max_seq, dtype
    scale = 1.0 / d**0.5
    app = (
        """  when() {on = rank, lo = 0, hi = 1} ({
    kv_append(%kc, %kn, %pt) {kv_head = "cluster"}
    kv_append(%vc, %vn, %pt) {kv_head = "cluster"}
  })
"""
        if append
        else ""
    )
    outs = "%y, %kc, %vc" if append else "%y"
    return f"""kernel @attn {{grid = {h}, cluster = {c}, {_big(c)}threads = 128, max_batch = {max_batch}}} (%q: {dt}[B, {g * h}, {d}], %kc: {dt}[B, {s}, {h}, {d}], %vc: {dt}[B, {s}, {h}, {d}], %lens: i32[B], %pos: i32[B], %knew: {dt}[B, {h * d}], %vnew: {dt}[B, {h * d}], %y: {dt}[B, {g * h}, {d}]) {{
  %qt = load(%q) {{offsets = ["0", "{g}*cluster", "0"], sizes = [B, {g}, {d}]}} : {dt}[B, {g}, {d}]
  %lt = load(%lens) {{offsets = ["0"], sizes = [B]}} : i32[B]
  %pt = load(%pos) {{offsets = ["0"], sizes = [B]}} : i32[B]
  %kn = load(%knew) {{offsets = ["0", "{d}*cluster"], sizes = [B, {d}]}} : {dt}[B, {d}]
  %vn = load(%vnew) {{offsets = ["0", "{d}*cluster"], sizes = [B, {d}]}} : {dt}[B, {d}]
  %m, %l, %o = attn_partial(%qt, %kc, %vc, %lt, %pt, %kn, %vn) {{kv_head = "cluster", part = "rank", parts = {c}, tile = {tile}, scale = {scale!r}}} : f32[B, {g}], f32[B, {g}], f32[B, {g}, {d}]
{app}  %mb = smem_alloc() : f32[B, {g}]
  smem_store(%mb, %m)
  cluster_barrier()
  %mm = cluster_reduce(%mb) {{op = max}} : f32[B, {g}]
  %pk = attn_rescale(%m, %l, %o, %mm) : f32[B, {g}, {d + 1}]
  %pb = smem_alloc() : f32[B, {g}, {d + 1}]
  smem_store(%pb, %pk)
  cluster_barrier()
  %red = cluster_reduce(%pb) {{op = sum}} : f32[B, {g}, {d + 1}]
  cluster_barrier()
  %out = attn_finish(%red) : f32[B, {g}, {d}]
  when() {{on = rank, lo = 0, hi = 1}} ({{
    store(%y, %out) {{offsets = ["0", "{g}*cluster", "0"]}}
  }})
  return {outs}
}}
"""


def masked_gemv(size: int, grid: int, k_tile: int, n_tile: int, k: int, n: int, dtype: str) -> str:
    """y = x @ w.T with w: [n, k] split-K over the cluster (tiles of k_tile columns) and split-N
    over clusters (n_tile rows); every access masked, so k and n may be anything."""
    return f"""kernel @mgemv {{grid = {grid}, cluster = {size}, {_big(size)}max_batch = 8}} (%x: {dtype}[B, {k}], %w: {dtype}[{n}, {k}], %y: {dtype}[B, {n}]) {{
  %xt = load(%x) {{offsets = ["0", "{k_tile}*rank"], sizes = [B, {k_tile}], masked = true}} : {dtype}[B, {k_tile}]
  %p = gemv(%xt, %w) {{row = "{n_tile}*cluster", col = "{k_tile}*rank", rows = {n_tile}, masked = true}} : f32[B, {n_tile}]
  %buf = smem_alloc() : f32[B, {n_tile}]
  smem_store(%buf, %p)
  cluster_barrier()
  %s = cluster_reduce(%buf) {{op = sum}} : f32[B, {n_tile}]
  cluster_barrier()
  when() {{on = rank, lo = 0, hi = 1}} ({{
    store(%y, %s) {{offsets = ["0", "{n_tile}*cluster"], masked = true}}
  }})
  return %y
}}
"""


def grid_sum(size: int, grid: int, n: int, dtype: str = "f32") -> str:
    """y[0, :] = sum over all CTAs g of x[g, :] (grid_reduce, one window, CTA order)."""
    return f"""kernel @gsum {{grid = {grid}, cluster = {size}, {_big(size)}threads = 128}} (%x: f32[{grid * size}, {n}], %y: {dtype}[1, {n}]) {{
  %t = load(%x) {{offsets = ["{size}*cluster + rank", "0"], sizes = [1, {n}]}} : f32[1, {n}]
  grid_reduce(%y, %t) {{offsets = ["0", "0"]}}
  return %y
}}
"""


def oproj_kernel(size: int, heads: int, k: int, n: int, dtype: str = "f16") -> str:
    """y = sum over heads h of x[:, h*k:(h+1)*k] @ w[:, h*k:(h+1)*k].T: one cluster per head,
    split-N over its CTAs, summed over clusters by grid_reduce (windows keyed by rank)."""
    ns = n // size
    return f"""kernel @oproj {{grid = {heads}, cluster = {size}, {_big(size)}threads = 128, max_batch = 4}} (%x: {dtype}[B, {heads * k}], %w: {dtype}[{n}, {heads * k}], %y: {dtype}[B, {n}]) {{
  %xt = load(%x) {{offsets = ["0", "{k}*cluster"], sizes = [B, {k}]}} : {dtype}[B, {k}]
  %p = gemv(%xt, %w) {{row = "{ns}*rank", col = "{k}*cluster", rows = {ns}}} : f32[B, {ns}]
  grid_reduce(%y, %p) {{offsets = ["0", "{ns}*rank"]}}
  return %y
}}
"""


_GRAPH_BODY = """  %h = reshape(%x) {{shape = [B, {heads}, {d}]}} : {dt}[B, {heads}, {d}]
  %n = rms_norm(%h, %wn) {{eps = 1e-05}} : {dt}[B, {heads}, {d}]
  %r = rope(%n, %pos) {{theta = 10000.0, style = {style}, rotary_dim = {rot}}} : {dt}[B, {heads}, {d}]
  %f = reshape(%r) {{shape = [B, {hd}]}} : {dt}[B, {hd}]
  %a, %b = split(%f) {{axis = 1, sizes = [{half}, {half}]}} : {dt}[B, {half}], {dt}[B, {half}]
  %s = silu_mul(%a, %b) : {dt}[B, {half}]
  %t = silu(%s) : {dt}[B, {half}]
  %u = add(%t, %a) : {dt}[B, {half}]
  %v = mul(%u, %b) : {dt}[B, {half}]
  %c = cast(%v) {{dtype = f32}} : f32[B, {half}]
"""


def graph_ops_kernel(
    heads: int = 2, d: int = 64, dtype: str = "f16", style: str = "neox", rot: int = 32
) -> str:
    """One CTA: load x, then the graph ops of :func:`graph_ops_graph`, store the result."""
    hd = heads * d
    body = _GRAPH_BODY.format(heads=heads, d=d, dt=dtype, style=style, rot=rot, hd=hd, half=hd // 2)
    return f"""kernel @ops {{grid = 1, cluster = 1, threads = 128, max_batch = 4}} (%xg: {dtype}[B, {hd}], %wg: {dtype}[{d}], %pg: i32[B], %y: f32[B, {hd // 2}]) {{
  %x = load(%xg) {{offsets = ["0", "0"], sizes = [B, {hd}]}} : {dtype}[B, {hd}]
  %wn = load(%wg) {{offsets = ["0"], sizes = [{d}]}} : {dtype}[{d}]
  %pos = load(%pg) {{offsets = ["0"], sizes = [B]}} : i32[B]
{body}  store(%y, %c) {{offsets = ["0", "0"]}}
  return %y
}}
"""


def graph_ops_graph(
    heads: int = 2, d: int = 64, dtype: str = "f16", style: str = "neox", rot: int = 32
) -> str:
    """The ops of :func:`graph_ops_kernel` as a graph (for the interpreter)."""
    hd = heads * d
    body = _GRAPH_BODY.format(heads=heads, d=d, dt=dtype, style=style, rot=rot, hd=hd, half=hd // 2)
    return f"""graph @ops(%x: {dtype}[B, {hd}], %wn: {dtype}[{d}], %pos: i32[B]) {{
{body}  return %c
}}
"""
