"""The ops of a lowered host graph that are not fusionc kernel launches, on the GPU: library
calls (cuBLAS GEMMs), row-wise graph ops as CuPy kernels (RMSNorm, SiLU·mul, add, feature
splits as views), the token blocks of ``split-tokens`` (views and a copy back), and the
collectives (:mod:`fusionc.runtime.comm_ops`).

Streams: ``stream = 1`` collectives run on a side stream (token-split overlap); everything else
on the caller's stream. Before an op runs, its stream waits for an event recorded on the stream
that produced each operand (recorded then: conservative and correct); at the end the caller's
stream waits for the side stream.
"""
from __future__ import annotations

import numpy as np

from fusionc.errors import CompileError
from fusionc.ir.ops.tokens import SPLIT_ATTRS, part_symbol, split_sizes
from fusionc.runtime import library
from fusionc.runtime.comm_ops import COMM_OPS

ROWWISE = ("library_call", "rms_norm", "silu_mul", "add", "split", "token_split",
           "token_concat")
HOST_OPS = frozenset(ROWWISE) | frozenset(COMM_OPS)


class Streams:
    """The caller's stream (0) and the side stream (1), with the stream each value came from."""

    def __init__(self, main, side_factory):
        self.main, self._side, self._factory = main, None, side_factory
        self.where: dict[str, int] = {}

    def get(self, sid: int):
        if sid == 0:
            return self.main
        if self._side is None:
            self._side = self._factory()
        return self._side

    def before(self, op, sid: int):
        """Make stream ``sid`` wait for the streams that produced the operands of ``op``."""
        import cupy
        for p in {self.where.get(v.name, 0) for v in op.operands} - {sid}:
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(self.get(p))
            self.get(sid).wait_event(ev)
        for r in op.results:
            self.where[r.name] = sid

    def join(self) -> None:
        """The caller's stream waits for the side stream (end of a call)."""
        if self._side is not None:
            import cupy
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(self._side)
            self.main.wait_event(ev)


def run_host_op(cg, op, views: dict, objs: dict, env: dict, torch_mode: bool, outputs,
                streams: Streams) -> None:
    """Run ``op`` of compiled graph ``cg``; its results join ``views`` and ``objs``."""
    from fusionc.runtime.comm_ops import run_comm_op
    sid = op.attr("stream") if op.name in COMM_OPS else 0
    streams.before(op, sid)
    stream = streams.get(sid)

    def alloc(r):   # a block of a token_concat is written in place into its rows
        return _block_output(cg, r, env, torch_mode, outputs, views)
    with stream:
        if op.name in COMM_OPS:
            for v in op.operands:   # feature splits are strided views; collectives move rows
                views[v.name] = _contiguous(views[v.name])
            run_comm_op(cg, op, views, objs, env, torch_mode, outputs, stream, alloc)
            return
        args = [views[v.name] for v in op.operands]
        if op.name in ("split", "token_split"):
            results = _views(op, args[0], env)
            for r, x in zip(op.results, results):
                views[r.name] = objs[r.name] = x
            return
        if op.name == "token_concat":   # the blocks were written into it in place
            obj, view = _concat_buffer(cg, op.result, env, torch_mode, outputs, views)
            row = 0
            for block in args:   # a block that is a view of something else: copied
                rows = view[row:row + block.shape[0]]
                if block.shape[0] and block.data.ptr != rows.data.ptr:
                    rows[...] = block
                row += block.shape[0]
            objs[op.result.name], views[op.result.name] = obj, view
            return
        outs = [alloc(r) for r in op.results]
        _compute(op, args, [view for _, view in outs], env)
        for r, (obj, view) in zip(op.results, outs):
            objs[r.name], views[r.name] = obj, view


def _views(op, x, env: dict) -> list:
    if op.name == "split":
        cuts = np.cumsum((0,) + tuple(op.attr("sizes")))
        return [x[..., a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    sizes = split_sizes(x.shape[0], **{a.name: op.attr(a.name) for a in SPLIT_ATTRS})
    sym = op.operands[0].type.shape[0]
    env.update({part_symbol(sym, i): n for i, n in enumerate(sizes)})
    cuts = np.cumsum([0] + sizes)
    return [x[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def _compute(op, args: list, outs: list, env: dict) -> None:
    dt = op.results[0].type.dtype.value
    if op.name == "library_call":
        library.gemm(args[0], args[1], outs[0], dt)
    elif op.name == "rms_norm":
        if op.operands[0].type.rank != 2:
            raise CompileError("RMSNorm over a tensor of rank other than 2", op=op.name,
                               loc=op.loc, valid="[T, D] rows")
        library.rms_norm(args[0], args[1], op.attr("eps"), outs[0], dt)
    elif op.name == "silu_mul":
        library.silu_mul(args[0], args[1], outs[0], dt)
    elif op.name == "add":
        library.add(args[0], args[1], outs[0], dt)


def _concat_buffer(cg, whole, env, torch_mode, outputs, views):
    """The output buffer ``(obj, view)`` of token_concat result ``whole`` (allocated once per
    call, when its first block is produced)."""
    key = "\0concat:" + whole.name
    if key not in views:
        views[key] = cg._output(whole, whole.name, env, torch_mode, outputs, views)
    return views[key]


def _block_output(cg, r, env, torch_mode, outputs, views):
    """A new buffer for result ``r``, or, when ``r`` is block i of a token_concat, the view of
    rows ``[B.0 + ... + B.(i-1), ...)`` of the concatenated buffer (no copy at the end)."""
    where = _concat_blocks(cg).get(r.name)
    if where is None:
        return cg._output(r, r.name, env, torch_mode, outputs, views)
    whole, i = where
    obj, view = _concat_buffer(cg, whole, env, torch_mode, outputs, views)
    base = whole.type.shape[0]
    start = sum(env[part_symbol(base, j)] for j in range(i))
    stop = start + env[part_symbol(base, i)]
    return obj[start:stop], view[start:stop]


def _concat_blocks(cg) -> dict:
    """``{block value name: (concatenated value, index)}`` of the host graph (cached)."""
    if getattr(cg, "_blocks", None) is None:
        cg._blocks = {v.name: (op.result, i) for op in cg.host.body
                      if op.name == "token_concat" for i, v in enumerate(op.operands)}
    return cg._blocks


def _contiguous(x):
    import cupy
    return x if x.flags.c_contiguous else cupy.ascontiguousarray(x)
