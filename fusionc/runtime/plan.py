"""Call plans of a :class:`fusionc.runtime.compiled.CompiledGraph`, one per argument signature
(issue 23: the host time of a call outside a CUDA graph).

The first call with a new signature (:func:`fusionc.runtime.arrays.signature`: array kind,
dtype, device, shape, layout and address alignment of every argument, and the current device)
runs the checked path; when it succeeds, a :class:`Plan` is kept for the signature, holding
what only the signature decides: the bound dims, the output buffers' shapes and dtypes, each
kernel's packed arguments (:class:`fusionc.runtime.params.ArgPack`) and which argument or
output feeds each pointer slot. A later call with that signature reads the argument pointers,
allocates the graph's outputs (:func:`fusionc.runtime.arrays.allocator`; intermediates are
the graph's scratch buffers) and
launches (:meth:`fusionc.runtime.launch.LoadedKernel.launcher`: one closure per kernel);
nothing is checked again because nothing it checked can have changed. A misaligned address
changes the signature, so it takes the checked path and gets its error.

Graphs of kernel launches, GEMMs (``library_call``: cuBLAS called with raw pointers when
there is no bias), row-wise ops (RMSNorm, SiLU, add, ..., the embedding: :data:`ROW_OPS`, row
kernels launched with raw pointers, :mod:`fusionc.runtime.row_kernels`), the other host
compute ops (:data:`fusionc.runtime.host_ops.HOST_COMPUTE`: a biased GEMM, MLA's head GEMMs;
CuPy views made once where the buffer is fixed) and collectives on the caller's stream
(tensor-parallel layers without a token split) run fully planned, and so do feature splits
and reshapes (:data:`VIEW_OPS`: a piece is its base buffer's pointer plus an offset, rows a
stride apart, which the row kernels and a GEMM's x take). Graphs with prompt-chunk ops, token
splits, side-stream collectives or pieces that a fused kernel or a graph output would need
whole, and calls given ``outputs=``, run the general path with the signature's checks and dims
reused (:meth:`Plan.views`: CuPy views of torch arguments made without checks, cached per
address).
"""
from __future__ import annotations

import math
import operator

from fusionc.runtime import arrays


def tuple_getter(idxs):
    """A function taking a sequence and returning the tuple of its items at ``idxs``."""
    idxs = tuple(idxs)
    if not idxs:
        return lambda s: ()
    if len(idxs) == 1:
        i = idxs[0]
        return lambda s: (s[i],)
    return operator.itemgetter(*idxs)


class Plan:
    """What one argument signature of a compiled graph fixes (see the module docstring).

    ``run`` is None unless every op of the host graph is one the planned path runs (launches,
    GEMMs, row-wise ops, feature splits and reshapes as views, collectives on the caller's
    stream; see the module docstring for the views it leaves to the general path); otherwise it is
    ``run(cg, args, ptrs)`` for the arguments in parameter order and their device pointers.
    """

    def __init__(self, cg, env: dict[str, int], torch_mode: bool, device: int):
        self.env, self.torch_mode, self.device = dict(env), torch_mode, device
        self._views: dict = {}
        self.run = _planned_run(cg, self.env, torch_mode, device)

    def views(self, cg, args) -> dict:
        """``{parameter: CuPy view}`` of ``args`` (in parameter order), unchecked."""
        cache = self._views if self.torch_mode else None
        return {p.name: arrays.unchecked_view(x, p, cache) for p, x in zip(cg.host.params, args)}


# host ops the plan launches as row kernels with raw pointers (float operands, contiguous)
ROW_OPS = frozenset({"rms_norm", "silu_mul", "add", "mul", "silu", "cast", "embedding"})
# views the plan follows as (base buffer, byte offset, row stride): a feature split's pieces
# and reshapes; the ops that read a strided piece take its row stride (row kernels but the
# embedding, a GEMM's x)
VIEW_OPS = frozenset({"split", "reshape"})


def _plannable(op) -> bool:
    """Whether the planned path runs host op ``op``: a launch, a GEMM, a row-wise op
    (:data:`ROW_OPS`, :data:`fusionc.runtime.host_ops.HOST_COMPUTE`), or a collective on the
    caller's stream (a side-stream one needs the general path's events)."""
    from fusionc.runtime.comm_ops import COMM_OPS
    from fusionc.runtime.host_ops import HOST_COMPUTE
    return op.name == "launch" or op.name in HOST_COMPUTE or op.name in ROW_OPS or \
        op.name in VIEW_OPS or op.name in COMM_OPS and op.attr("stream") == 0


def _planned_run(cg, env, torch_mode, device):
    """The fast ``run(cg, args, ptrs)`` of a host graph of kernel launches, GEMMs, row-wise
    ops and collectives on the caller's stream only; None for other graphs."""
    from fusionc.runtime.comm_ops import COMM_OPS
    host = cg.host
    if not all(_plannable(op) for op in host.body):
        return None
    index = {p.name: i for i, p in enumerate(host.params)}
    allocs, steps = [], []
    fixed: dict = {}     # value name -> CuPy view of the graph's scratch buffer for it
    current = [None, None]   # this call's arguments and outputs, its CuPy stream (host steps)
    kept: list = []          # scratch buffers the steps use (a capture keeps them too: a
    #                          larger batch may regrow the graph's own)

    def output(v, r):   # result r's buffer (typed like v): per call, or the graph's scratch
        index[r.name] = len(host.params) + len(allocs)
        if r.name in cg._outs:
            allocs.append(arrays.allocator(v, env, torch_mode, device))
        else:   # an intermediate: the graph's scratch buffer (CompiledGraph.scratch)
            obj, view = cg.scratch(v, r.name, env, torch_mode)
            fixed[r.name] = view
            kept.append(obj)
            ptr = obj.data_ptr() if torch_mode else obj.data.ptr
            allocs.append(lambda obj=obj, ptr=ptr: (obj, ptr))
        return index[r.name]

    views: dict = {}   # value name -> (byte offset, row stride in elements): a strided piece
    aliases: set = set()   # reshape results: another shape of their operand's buffer
    for op in host.body:
        if op.name in VIEW_OPS:
            if not _plan_view(op, env, index, views, cg._outs):
                return None
            if op.name == "reshape":
                aliases.add(op.result.name)
            continue
        if any(v.name in views for v in op.operands) and not _reads_views(op, views):
            return None   # the general path copies such pieces
        if _on_cupy(op) and any(v.name in aliases for v in op.operands):
            return None   # CuPy views of a reshape: the general path's
        if _on_cupy(op):   # a collective or a CuPy op
            for r in op.results:
                output(r, r)
            if op.name in COMM_OPS:
                steps.append(_comm_step(cg, op, env, torch_mode, index, fixed, current))
            else:
                steps.append(_host_step(cg, op, env, torch_mode, index, fixed, current))
            continue
        if op.name == "library_call":
            steps.append(_gemm_step(op, env, device, index, output(op.result, op.result),
                                    views))
            continue
        if op.name in ROW_OPS:
            output(op.result, op.result)
            steps.append(_row_step(op, env, device, index, views))
            continue
        k = cg.module[op.attr("kernel").name]
        lk = cg._loaded[k.name]
        local = {p.name: index[a.name] for p, a in zip(k.params, op.operands)}
        result_of = {v.name: r for v, r in zip(k.outputs, op.results)}
        for p in k.params[len(op.operands):]:  # pure outputs: allocated per call, or scratch
            local[p.name] = output(p, result_of[p.name])
        pack = lk.pack(env)
        steps.append(lk.launcher(pack, tuple_getter(local[n] for n in pack.names)))
        for p, a in zip(k.params, op.operands):  # updated in place (KV caches)
            if p.name in result_of:
                if a.name in aliases and result_of[p.name].name in cg._outs:
                    return None   # the output would be the buffer in its base's shape
                index[result_of[p.name].name] = index[a.name]
    result = tuple_getter(index[v.name] for v in host.outputs)
    import cupy
    stream_of = arrays.stream_getter(torch_mode)
    capturing = cupy.cuda.runtime.streamIsCapturing   # (arrays.is_capturing, one frame less)

    on_cupy = any(map(_on_cupy, host.body))

    def run(cg, args, ptrs):
        stream = stream_of()
        current[0] = args
        for alloc in allocs:
            obj, ptr = alloc()
            args.append(obj)
            ptrs.append(ptr)
        try:
            if on_cupy:   # CuPy-run steps and the collectives: on the caller's stream
                with arrays.external_stream(stream, device) as cs:
                    current[1] = cs
                    for step in steps:
                        step(ptrs, stream)
            else:
                for step in steps:
                    step(ptrs, stream)
        finally:   # the plan must not keep this call's buffers alive
            current[0] = current[1] = None
        if capturing(stream):  # the graph's replays write into these buffers
            cg._captured.append(tuple(args) + tuple(kept))
        return result(args)
    return run


def _on_cupy(op) -> bool:
    """A host op the plan runs through CuPy (a collective, a biased GEMM, a head GEMM), not by
    a raw launch, a row kernel, a raw-pointer GEMM or a view: the call then enters the
    caller's stream as CuPy's."""
    return op.name != "launch" and op.name not in ROW_OPS and op.name not in VIEW_OPS and \
        not _fast_gemm(op)


def _plan_view(op, env, index, views, outs) -> bool:
    """Follow view op ``op``: a reshape aliases its operand's buffer; piece k of a feature
    split (``sizes`` along the last axis of a contiguous ``[..., C]``) starts ``cut_k``
    elements into each row of C. False (no plan) for a view of a strided piece or a view that
    is a graph output (the general path gives those their own buffers)."""
    x = op.operands[0]
    if x.name in views or any(r.name in outs for r in op.results):
        return False
    if op.name == "reshape":
        index[op.result.name] = index[x.name]
        return True
    if op.attr("axis") % x.type.rank != x.type.rank - 1:
        return False   # pieces of rows: the general path's views
    cols, item, cut = x.type.concrete(env)[-1], x.type.dtype.itemsize, 0
    for r, n in zip(op.results, op.attr("sizes")):
        if r.type.rank != 2:
            return False   # rows of a rank-2 piece only: one stride between them
        index[r.name] = index[x.name]
        views[r.name] = (cut * item, cols)
        cut += n
    return True


def _reads_views(op, views) -> bool:
    """Whether the plan's step for ``op`` takes its strided pieces: a row kernel (not the
    embedding) or a raw-pointer GEMM's x (its weight must be whole)."""
    if op.name in ROW_OPS:
        return op.name != "embedding"
    return _fast_gemm(op) and op.operands[1].name not in views


def _fast_gemm(op) -> bool:
    """A GEMM without a bias: cuBLAS called with raw pointers (:func:`_gemm_step`)."""
    return op.name == "library_call" and len(op.operands) == 2


def _viewer(cg, index, fixed):
    """``view(value)``: a function of one call's arguments and outputs (``objs``) giving the
    CuPy view of host value ``value``: the graph's scratch buffer (views made once in
    ``fixed``), an argument (views cached per address, as :meth:`Plan.views`) or this call's
    output."""
    params = {p.name: p for p in cg.host.params}
    cache: dict = {}

    def view(v):
        got = fixed.get(v.name)
        if got is not None:
            return lambda objs: got
        i, p = index[v.name], params.get(v.name)
        if p is not None:
            return lambda objs: arrays.unchecked_view(objs[i], p, cache)
        return lambda objs: arrays.unchecked_view(objs[i], v)
    return view


def _host_step(cg, op, env, torch_mode, index, fixed, current):
    """Host op ``op`` run through CuPy (a biased GEMM, a head GEMM:
    :func:`fusionc.runtime.host_ops.compute`) on the caller's stream, its buffers as in
    :func:`_viewer`. A block of no rows is skipped, as the general path skips it."""
    from fusionc.runtime.host_ops import compute
    view = _viewer(cg, index, fixed)
    if 0 in op.results[0].type.concrete(env):
        return lambda ptrs, stream: None
    ins, out = [view(v) for v in op.operands], view(op.results[0])

    def step(ptrs, stream):
        objs = current[0]
        compute(op, [f(objs) for f in ins], out(objs))
    return step


def _pointers(operands, index, views, cols_of):
    """``(get(ptrs) -> the operands' device pointers, their row strides)``: a strided piece's
    pointer is its base buffer's plus its offset."""
    idx = [index[v.name] for v in operands]
    at = [views.get(v.name, (0, cols_of(v))) for v in operands]
    lds = tuple(ld for _, ld in at)
    if not any(off for off, _ in at):
        return tuple_getter(idx), lds
    offs = tuple(off for off, _ in at)
    return (lambda ptrs: tuple(ptrs[i] + o for i, o in zip(idx, offs))), lds


def _row_step(op, env, device, index, views):
    """Row-wise op ``op`` (:data:`ROW_OPS`) as one row kernel (operands contiguous or
    strided pieces, :func:`_pointers`; the output contiguous), its
    launch fixed for the signature's shape and owned by the plan
    (:mod:`fusionc.runtime.row_kernels`)."""
    from fusionc.runtime import row_kernels
    shape = op.result.type.concrete(env)
    dt, cols, n = op.result.type.dtype.value, shape[-1] if shape else 1, math.prod(shape)
    ins, lds = _pointers(op.operands, index, views,
                         lambda v: (v.type.concrete(env) or (1,))[-1])
    lds += (cols,)
    if op.name == "rms_norm":
        launch = row_kernels.rms_norm(dt, n // cols if cols else 0, cols, float(op.attr("eps")),
                                      lds, device, cached=False)
    elif op.name == "embedding":
        vocab, hidden = op.operands[0].type.concrete(env)
        launch = row_kernels.embedding(dt, n // hidden if hidden else 0, vocab, hidden, device,
                                       cached=False)
    elif op.name in row_kernels.BINARY:
        launch = row_kernels.binary(op.name, dt, n, cols, lds, device, cached=False)
    else:   # silu, cast (a copy to the same dtype)
        launch = row_kernels.unary(op.name, op.operands[0].type.dtype.value, dt, n, cols, lds,
                                   device, cached=False)
    out = index[op.result.name]

    def step(ptrs, stream):
        launch(ins(ptrs) + (ptrs[out],), stream)
    return step


def _comm_step(cg, op, env, torch_mode, index, fixed, current):
    """Collective ``op`` (:func:`fusionc.runtime.comm_ops.run_comm_op`) on the caller's stream,
    its buffers as in :func:`_viewer`. A block of no rows is skipped, as the general path
    skips it."""
    from fusionc.runtime.comm_ops import run_comm_op
    view = _viewer(cg, index, fixed)
    if 0 in op.results[0].type.concrete(env):
        return lambda ptrs, stream: None

    ins = [(v.name, view(v)) for v in op.operands]
    outs = {r.name: (index[r.name], view(r)) for r in op.results}

    def step(ptrs, stream):
        objs = current[0]

        def result(r):
            i, f = outs[r.name]
            return objs[i], f(objs)
        run_comm_op(cg, op, {n: f(objs) for n, f in ins}, {}, env, torch_mode, None,
                    current[1], result)
    return step


def _gemm_step(op, env, device, index, out, views):
    """``out = x · wᵀ`` of ``library_call`` op (w and the result contiguous: arguments that
    passed their checks, or buffers allocated by the plan; x may be a strided piece of a
    split, :func:`_plan_view`)."""
    from fusionc.runtime.library import gemm_plan
    x, w = op.operands
    T, K = x.type.concrete(env)
    off, ldx = views.get(x.name, (0, K))
    run = gemm_plan(T, K, w.type.concrete(env)[0], x.type.dtype.value, device,
                    op.result.type.dtype.value, ldx)
    ix, iw = index[x.name], index[w.name]

    def step(ptrs, stream):
        run(stream, ptrs[ix] + off, ptrs[iw], ptrs[out])
    return step
