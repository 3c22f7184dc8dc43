"""The ops of a lowered host graph that are not fusionc kernel launches, on the GPU: library
calls (cuBLAS GEMMs, with a bias), row-wise graph ops as row kernels (RMSNorm, SiLU, SiLU·mul,
add, mul, cast, the embedding's gather: :mod:`.row_kernels`; feature splits and heads as views), a prompt chunk's
RoPE, KV-cache write and attention and a decode step's attention the units do not take
(RoPE, in-place KV append, decode attention: :mod:`.library_attention`), the token blocks of
``split-tokens`` (views; each block's result written in place into its rows of the joined
buffer), and the collectives (:mod:`.comm_ops`).

Streams: ``stream = 1`` collectives run on a side stream (token-split overlap); everything else
on the caller's stream. Before an op runs, its stream waits for an event recorded on the stream
that produced each operand (recorded then: conservative and correct); at the end the caller's
stream waits for the side stream. Ops on a block of zero rows are skipped (every rank has the
same block sizes). Buffers allocated during a call live until its end; while a CUDA graph is
being captured the compiled graph keeps them for as long as it lives (the graph's replays
write into them).
"""
from __future__ import annotations

import numpy as np

from fusionc.errors import InputError
from fusionc.ir.ops.tokens import LIBRARY_OPS, SPLIT_ATTRS, part_symbol, split_sizes
from fusionc.runtime import library
from fusionc.runtime.comm_ops import COMM_OPS

HOST_OPS = LIBRARY_OPS | frozenset({"token_split", "token_concat"})
# the host ops that are views or copies of rows: any dtype (token ids too)
HOST_VIEWS = frozenset({"token_split", "token_concat", "split", "reshape"})
# the ops compute() runs as row kernels or GEMMs: float operands only
HOST_COMPUTE = frozenset({"library_call", "head_linear", "rms_norm", "silu_mul", "add", "mul",
                          "silu", "cast"})


class Streams:
    """One call's streams: the caller's (0) and the side stream (1), the stream each value
    came from, the joined buffers of token_concat, and temporaries to keep alive."""

    def __init__(self, main, side_factory):
        self.main, self._side, self._factory = main, None, side_factory
        self.where: dict[str, int] = {}
        self.joined: dict[str, tuple] = {}
        self.keep: list = []

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
        return _block_output(cg, r, env, torch_mode, outputs, views, streams)
    with stream:
        if op.name in ("split", "token_split"):
            for r, x in zip(op.results, _views(op, views[op.operands[0].name], env)):
                views[r.name] = objs[r.name] = x
            return
        if op.name == "token_concat":
            _concat(cg, op, views, objs, env, torch_mode, outputs, streams)
            return
        if op.name == "reshape":   # heads split or merged: a view where the strides allow
            x = views[op.operands[0].name].reshape(op.result.type.concrete(env))
            if op.result.name in cg._outs:   # a graph output: its own buffer, not a view of
                obj, view = alloc(op.result)  # scratch the next call overwrites
                view[...] = x
                objs[op.result.name], views[op.result.name] = obj, view
            else:
                views[op.result.name] = objs[op.result.name] = x
            return
        if op.name in ("kv_cache_write", "kv_cache_append"):   # in place: results = caches
            from fusionc.runtime import library_attention
            getattr(library_attention, op.name)(*(views[v.name] for v in op.operands),
                                                op.operands[0].type.dtype.value)
            for r, a in zip(op.results, op.operands):
                views[r.name], objs[r.name] = views[a.name], objs[a.name]
            return
        if op.results and 0 in op.results[0].type.concrete(env):   # an empty block: skipped
            for r in op.results:
                objs[r.name], views[r.name] = alloc(r)
            return
        if op.name in COMM_OPS:   # feature splits are strided views; collectives move rows
            local = dict(views)
            for v in op.operands:
                local[v.name] = _contiguous(views[v.name], streams)
            run_comm_op(cg, op, local, objs, env, torch_mode, outputs, stream, alloc)
            for r in op.results:
                views[r.name] = local[r.name]
            return
        outs = [alloc(r) for r in op.results]

        compute(op, [views[v.name] for v in op.operands], outs[0][1])
        for r, (obj, view) in zip(op.results, outs):
            objs[r.name], views[r.name] = obj, view


def _views(op, x, env: dict) -> list:
    if op.name == "split":   # along its axis (the last one for a feature split)
        cuts = np.cumsum((0,) + tuple(op.attr("sizes")))
        axis = op.attr("axis") % x.ndim
        return [x[(slice(None),) * axis + (slice(a, b),)] for a, b in zip(cuts[:-1], cuts[1:])]
    sizes = split_sizes(x.shape[0], **{a.name: op.attr(a.name) for a in SPLIT_ATTRS})
    bind_blocks(env, op.operands[0].type.shape[0], sizes, op)
    cuts = np.cumsum([0] + sizes)
    return [x[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def bind_blocks(env: dict, sym: str, sizes: list[int], op) -> None:
    """Bind ``sym.i`` to the block sizes; InputError if an input already bound them
    otherwise."""
    for i, n in enumerate(sizes):
        if env.setdefault(part_symbol(sym, i), n) != n:
            raise InputError(f"symbol {part_symbol(sym, i)} is {env[part_symbol(sym, i)]} but "
                             f"block {i} of {sym} has {n} rows", op=op.name, loc=op.loc,
                             valid=f"no input typed with {sym}.<i> (token_split names them)")


def compute(op, args: list, out) -> None:
    """Run a row-wise host op into ``out`` on the current CuPy stream (the general path and
    the call plan's CuPy steps, :mod:`fusionc.runtime.plan`)."""
    dt = op.results[0].type.dtype.value
    if op.name == "library_call":
        library.gemm(args[0], args[1], out, op.operands[0].type.dtype.value, *args[2:],
                     out_dtype=dt)
    elif op.name == "head_linear":
        library.head_gemm(args[0], args[1], out, dt)
    elif op.name == "rms_norm":   # over the last axis: [T, D], or [T, heads, D] (QK-norm)
        x, d = args[0], args[0].shape[-1]
        rows = x.size // d if d else 0
        library.rms_norm(x.reshape(rows, d), args[1], op.attr("eps"), out.reshape(rows, d), dt)
    elif op.name == "silu_mul":
        library.silu_mul(args[0], args[1], out, dt)
    elif op.name == "add":
        library.add(args[0], args[1], out, dt)
    elif op.name == "mul":
        library.mul(args[0], args[1], out, dt)
    elif op.name == "silu":
        library.silu(args[0], out, dt)
    elif op.name == "cast":
        library.cast(args[0], out, op.operands[0].type.dtype.value, dt)
    elif op.name == "embedding":
        library.embedding(args[0], args[1], out)
    elif op.name == "rope":
        from fusionc.runtime import library_attention
        library_attention.rope(args[0], args[1], out, theta=op.attr("theta"),
                               style=op.attr("style"), rotary_dim=op.attr("rotary_dim"),
                               scaling=op.attr("scaling"), dtype=dt)
    elif op.name in ("chunk_attention", "decode_attention"):
        from fusionc.runtime import library_attention
        getattr(library_attention, op.name)(*args, op.attr("scale"), out, dt)


def _concat(cg, op, views, objs, env, torch_mode, outputs, streams) -> None:
    """The joined buffer; its blocks were written into it in place (a block that is a view of
    something else is copied)."""
    obj, view = _joined(cg, op.result, env, torch_mode, outputs, views, streams)
    row = 0
    for v in op.operands:
        block = views[v.name]
        rows = view[row:row + block.shape[0]]
        if block.shape[0] and block.data.ptr != rows.data.ptr:
            rows[...] = block
        row += block.shape[0]
    objs[op.result.name], views[op.result.name] = obj, view


def _joined(cg, whole, env, torch_mode, outputs, views, streams):
    """The buffer ``(obj, view)`` of token_concat result ``whole`` (allocated once per call,
    when its first block is produced)."""
    if whole.name not in streams.joined:
        streams.joined[whole.name] = cg._output(whole, whole.name, env, torch_mode, outputs,
                                                views)
    return streams.joined[whole.name]


def _block_output(cg, r, env, torch_mode, outputs, views, streams):
    """A new buffer for graph output ``r``, the graph's scratch buffer for an intermediate
    (:meth:`CompiledGraph.scratch`), or, when ``r`` is block i of a token_concat, the view of
    rows ``[B.0 + ... + B.(i-1), ...)`` of the joined buffer (no copy at the end)."""
    where = _concat_blocks(cg).get(r.name)
    if where is None and r.name not in cg._outs:   # an intermediate: reused (a capture
        return cg.scratch(r, r.name, env, torch_mode)  # allocates nothing)
    if where is None:
        return cg._output(r, r.name, env, torch_mode, outputs, views)
    whole, i = where
    obj, view = _joined(cg, whole, env, torch_mode, outputs, views, streams)
    base = whole.type.shape[0]
    start = sum(env[part_symbol(base, j)] for j in range(i))
    stop = start + env[part_symbol(base, i)]
    return obj[start:stop], view[start:stop]


def _concat_blocks(cg) -> dict:
    """``{block value name: (joined value, index)}`` of the host graph (cached)."""
    if cg.concat_blocks is None:
        cg.concat_blocks = {v.name: (op.result, i) for op in cg.host.body
                            if op.name == "token_concat" for i, v in enumerate(op.operands)}
    return cg.concat_blocks


def _contiguous(x, streams: Streams):
    import cupy
    if x.flags.c_contiguous:
        return x
    y = cupy.ascontiguousarray(x)
    streams.keep.append(y)
    return y
