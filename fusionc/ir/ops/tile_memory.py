"""Tile IR: memory ops of a CTA — global tiles, shared-memory buffers, barriers.

- ``load(%g) {offsets, sizes, masked}``: a tile of a global tensor (kernel parameter) at
  per-CTA affine offsets (``fusionc.ir.affine``). With ``masked``, elements outside the tensor
  read as 0 (K tails); otherwise they are an error.
- ``store(%g, %t) {offsets, masked}``: write a tile into an output parameter, rounding to its
  dtype; with ``masked``, elements outside the tensor are dropped.
- ``smem_alloc() : type``: a shared-memory buffer of this CTA; ``smem_store(%buf, %t)`` writes
  it (rounding to its dtype), ``smem_load(%buf)`` reads it back. Peers read it only through
  collectives (``tile_collective``).
- ``barrier()``: all threads of the CTA (``__syncthreads``); the simulator models a CTA as one
  unit, so it orders nothing there. ``cluster_barrier()``: all threads of all CTAs of the cluster
  (``barrier.cluster.arrive.release`` + ``wait.acquire``): starts a new barrier phase.
"""

from __future__ import annotations

import numpy as np

from fusionc.errors import SimulationError
from fusionc.ir.registry import AFFINES, BOOL, DIMS, Cost, OpDef, attr, fail, register
from fusionc.sim.state import SmemBuffer

K = frozenset({"kernel"})


def param_of(op, graph, value, what: str):
    """A VerifyError unless ``value`` is a kernel parameter (a global tensor)."""
    if graph is not None and all(p.name != value.name for p in graph.params):
        fail(op, f"{what} %{value.name} is not a kernel parameter", "a global tensor parameter")


def def_of(graph, value):
    """The op defining ``value`` in ``graph`` (None for parameters)."""
    for o in graph.walk():
        if any(r.name == value.name for r in o.results):
            return o
    return None


def buffer_of(op, graph, value):
    """A VerifyError unless ``value`` comes from smem_alloc."""
    if graph is not None:
        d = def_of(graph, value)
        if d is None or d.name != "smem_alloc":
            fail(op, f"%{value.name} is not a shared-memory buffer", "a result of smem_alloc()")


def window(op, cta, shape) -> tuple[list[slice], list[slice], bool]:
    """Index slices of the tile in the tensor and in the tile for this CTA; whether all of the
    tile lies inside the tensor."""
    offs = [a(cta.cluster, cta.rank) for a in op.attr("offsets")]
    sizes = (
        op.results[0].type.concrete(cta.env)
        if op.results
        else op.operands[1].type.concrete(cta.env)
    )
    src, dst, inside = [], [], True
    for o, n, dim in zip(offs, sizes, shape):
        lo, hi = max(o, 0), min(o + n, dim)
        inside &= o >= 0 and o + n <= dim
        src.append(slice(lo, max(lo, hi)))
        dst.append(slice(lo - o, max(lo, hi) - o))
    return src, dst, inside


def _bounds_error(op, cta, shape):
    offs = [a(cta.cluster, cta.rank) for a in op.attr("offsets")]
    raise SimulationError(
        f"tile at offsets {offs} of CTA (cluster {cta.cluster}, rank {cta.rank}) leaves the "
        f"tensor of shape {list(shape)}",
        op=op.name,
        loc=op.loc,
        valid="offsets + sizes inside the tensor, or masked = true",
    )


def _infer_load(op):
    g = op.operands[0].type
    offs, sizes = op.attr("offsets"), op.attr("sizes")
    if len(offs) != g.rank or len(sizes) != g.rank:
        fail(op, f"{len(offs)} offsets and {len(sizes)} sizes for {g}", f"{g.rank} of each")
    return (g.with_shape(sizes),)


def _sim_load(op, args, cta):
    name = op.operands[0].name
    arr = cta.memory.arrays[name]
    src, dst, inside = window(op, cta, arr.shape)
    if not inside and not op.attr("masked"):
        _bounds_error(op, cta, arr.shape)
    out = np.zeros(op.result.type.concrete(cta.env), arr.dtype)
    out[tuple(dst)] = cta.memory.read(name, tuple(src), cta, op)
    return (out,)


def _infer_store(op):
    g, t = (v.type for v in op.operands)
    if len(op.attr("offsets")) != g.rank or t.rank != g.rank:
        fail(
            op,
            f"tile {t} and {len(op.attr('offsets'))} offsets for {g}",
            f"a tile of rank {g.rank} and {g.rank} offsets",
        )
    return ()


def _verify_store(op, graph, module):
    param_of(op, graph, op.operands[0], "store target")
    if graph is not None and all(v.name != op.operands[0].name for v in graph.outputs):
        fail(
            op,
            f"store to %{op.operands[0].name}, which the kernel does not return",
            "stores only to parameters listed in the kernel's return",
        )


def _sim_store(op, args, cta):
    name = op.operands[0].name
    arr = cta.memory.arrays[name]
    src, dst, inside = window(op, cta, arr.shape)
    if not inside and not op.attr("masked"):
        _bounds_error(op, cta, arr.shape)
    cta.memory.write(
        name, tuple(src), np.asarray(args[1])[tuple(dst)], cta, op, op.operands[0].type.dtype
    )
    return ()


def _sim_alloc(op, args, cta):
    t = op.result.type
    buf = SmemBuffer(op.result.name, t.dtype, np.full(t.concrete(cta.env), np.nan, t.dtype.numpy))
    cta.smem[op.result.name] = buf
    return (buf,)


def _infer_smem_store(op):
    b, t = (v.type for v in op.operands)
    if b.shape != t.shape:
        fail(
            op,
            f"tile {t} does not fit buffer {b}",
            f"a tile of shape [{', '.join(map(str, b.shape))}]",
        )
    return ()


def _sim_smem_store(op, args, cta):
    args[0].store(np.asarray(args[1]), cta.phase, op, cta.rank)
    return ()


def _sim_smem_load(op, args, cta):
    buf = args[0]
    if buf.written_phase is None:
        raise SimulationError(
            f"reads %{buf.name} before anything was stored in it",
            op=op.name,
            loc=op.loc,
            valid="smem_store before smem_load",
        )
    return (buf.data.copy(),)


def _sim_cluster_barrier(op, ctas):
    for c in ctas:
        c.phase += 1
    return [()] * len(ctas)


_off = attr("offsets", AFFINES, doc="per-axis affine offsets in cluster and rank")
_masked = attr("masked", BOOL, False, doc="out-of-tensor elements read 0 / are dropped")
_buf = lambda op, g, m: buffer_of(op, g, op.operands[0])  # noqa: E731


def _tile_bytes(v, env):
    return v.type.nbytes(env)


def _cost_load(op, env):
    return Cost(bytes_read=_tile_bytes(op.results[0], env))


def _cost_store(op, env):
    return Cost(bytes_written=_tile_bytes(op.operands[1], env))


register(
    OpDef(
        "load",
        "Global tile load (see module docstring).",
        ("src",),
        (_off, attr("sizes", DIMS), _masked),
        _infer_load,
        where=K,
        simulate=_sim_load,
        verify=lambda op, g, m: param_of(op, g, op.operands[0], "load source"),
        cost=_cost_load,
    )
)
register(
    OpDef(
        "store",
        "Global tile store (see module docstring).",
        ("dst", "tile"),
        (_off, _masked),
        _infer_store,
        where=K,
        simulate=_sim_store,
        verify=_verify_store,
        cost=_cost_store,
    )
)
register(
    OpDef(
        "smem_alloc",
        "A shared-memory buffer of the CTA.",
        (),
        (),
        lambda op: (
            tuple(r.type for r in op.results)
            if len(op.results) == 1
            else fail(op, "smem_alloc has one result", "%b = smem_alloc() : f32[...]")
        ),
        where=K,
        simulate=_sim_alloc,
    )
)
register(
    OpDef(
        "smem_store",
        "Write a tile into the CTA's own buffer.",
        ("buffer", "tile"),
        (),
        _infer_smem_store,
        where=K,
        simulate=_sim_smem_store,
        verify=_buf,
    )
)
register(
    OpDef(
        "smem_load",
        "Read the CTA's own buffer.",
        ("buffer",),
        (),
        lambda op: (op.operands[0].type,),
        where=K,
        simulate=_sim_smem_load,
        verify=_buf,
    )
)
register(
    OpDef(
        "barrier",
        "CTA-wide barrier (__syncthreads).",
        (),
        (),
        lambda op: (),
        where=K,
        simulate=lambda op, args, cta: (),
    )
)
register(
    OpDef(
        "cluster_barrier",
        "Cluster-wide barrier; starts a new barrier phase.",
        (),
        (),
        lambda op: (),
        where=K,
        simulate=_sim_cluster_barrier,
        collective=True,
    )
)
