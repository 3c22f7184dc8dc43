"""Running the tensor-parallel collectives of a host graph through a
:class:`fusionc.comm.Communicator` (``all_reduce``, ``all_reduce_add``,
``all_reduce_add_rms_norm``)."""
from __future__ import annotations

from fusionc.errors import InputError
from fusionc.ir.types import DType

COMM_OPS = ("all_reduce", "all_reduce_add", "all_reduce_add_rms_norm")


def run_comm_op(cg, op, views: dict, objs: dict, env: dict, torch_mode: bool, outputs,
                stream, alloc=None) -> None:
    """Run collective ``op`` of compiled graph ``cg`` on ``stream``; its results join
    ``views`` (CuPy) and ``objs`` (what the caller gets back). ``alloc(result)`` gives an
    output buffer ``(obj, view)`` (default: a new one)."""
    comm = cg.comm
    if comm is not None and op.attr("stream") != 0:
        comm = side_communicator(cg)
    if comm is None:
        raise InputError("the graph has a tensor-parallel collective but no communicator",
                         op=op.name, loc=op.loc,
                         valid="fusionc.compile(..., comm=fusionc.comm.Communicator()) in "
                               "every rank's process (start them with `fusionc launch`)")
    if op.attr("group") != comm.world:
        raise InputError(f"group = {op.attr('group')} but the communicator has {comm.world} "
                         "ranks", op=op.name, loc=op.loc, valid=f"group = {comm.world}")
    alloc = alloc or (lambda r: cg._output(r, r.name, env, torch_mode, outputs, views))
    outs = {r.name: alloc(r) for r in op.results}
    ins = [views[v.name] for v in op.operands]
    bf16 = op.operands[0].type.dtype == DType.bf16
    kw = {"stream": stream, "dtype": "bf16" if bf16 else None, "scope": op.attr("scope")}
    if op.name == "all_reduce_add_rms_norm":
        y, h = (outs[r.name][1] for r in op.results)
        comm.all_reduce(ins[0], ins[1], ins[2], op.attr("eps"), out_y=y, out_h=h, **kw)
    else:
        (h,) = (outs[r.name][1] for r in op.results)
        comm.all_reduce(ins[0], ins[1] if len(ins) > 1 else None, out_h=h, **kw)
    for r in op.results:
        objs[r.name], views[r.name] = outs[r.name]


def side_communicator(cg):
    """The communicator of the side stream: ``cg.comm.side(cg.side_ctas)`` (its own flags —
    one per stream — owned, checked and closed by the main one)."""
    return cg.comm.side(cg.side_ctas)
