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

Graphs of kernel launches, GEMMs without a bias (``library_call``) and collectives on the
caller's stream (tensor-parallel layers without a token split) run fully planned. Graphs
with a biased GEMM, other host ops or side-stream collectives, and calls given ``outputs=``,
run the general path with the signature's checks and dims reused (:meth:`Plan.views`: CuPy views of
torch arguments made without checks, cached per address).
"""
from __future__ import annotations

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
    GEMMs without a bias, collectives on the caller's stream); otherwise it is
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


def _plannable(op) -> bool:
    """Whether the planned path runs host op ``op``: a launch, a GEMM without a bias, or a
    collective on the caller's stream (a side-stream one needs the general path's events)."""
    from fusionc.runtime.comm_ops import COMM_OPS
    return op.name == "launch" or op.name == "library_call" and len(op.operands) == 2 or \
        op.name in COMM_OPS and op.attr("stream") == 0


def _planned_run(cg, env, torch_mode, device):
    """The fast ``run(cg, args, ptrs)`` of a host graph of kernel launches, GEMMs without a
    bias (``library_call``) and collectives on the caller's stream only; None for other
    graphs."""
    host = cg.host
    if not all(_plannable(op) for op in host.body):
        return None
    index = {p.name: i for i, p in enumerate(host.params)}
    allocs, steps = [], []
    fixed: dict = {}     # value name -> CuPy view of the graph's scratch buffer for it
    current = [None]     # this call's arguments and outputs (read by the collectives' steps)

    def output(v, r):   # result r's buffer (typed like v): per call, or the graph's scratch
        index[r.name] = len(host.params) + len(allocs)
        if r.name in cg._outs:
            allocs.append(arrays.allocator(v, env, torch_mode, device))
        else:   # an intermediate: the graph's scratch buffer (CompiledGraph.scratch)
            obj, view = cg.scratch(v, r.name, env, torch_mode)
            fixed[r.name] = view
            ptr = obj.data_ptr() if torch_mode else obj.data.ptr
            allocs.append(lambda obj=obj, ptr=ptr: (obj, ptr))
        return index[r.name]

    for op in host.body:
        if op.name != "launch" and op.name != "library_call":   # a collective
            for r in op.results:
                output(r, r)
            steps.append(_comm_step(cg, op, env, torch_mode, index, fixed, current))
            continue
        if op.name == "library_call":
            steps.append(_gemm_step(op, env, device, index, output(op.result, op.result)))
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
                index[result_of[p.name].name] = index[a.name]
    result = tuple_getter(index[v.name] for v in host.outputs)
    import cupy
    stream_of = arrays.stream_getter(torch_mode)
    capturing = cupy.cuda.runtime.streamIsCapturing   # (arrays.is_capturing, one frame less)

    def run(cg, args, ptrs):
        stream = stream_of()
        current[0] = args
        for alloc in allocs:
            obj, ptr = alloc()
            args.append(obj)
            ptrs.append(ptr)
        try:
            for step in steps:
                step(ptrs, stream)
        finally:   # the plan must not keep this call's buffers alive
            current[0] = None
        if capturing(stream):  # the graph's replays write into these buffers
            cg._captured.append(tuple(args))
        return result(args)
    return run


def _comm_step(cg, op, env, torch_mode, index, fixed, current):
    """Collective ``op`` (:func:`fusionc.runtime.comm_ops.run_comm_op`) on the caller's stream:
    its operands and results are the graph's scratch buffers (views made once), arguments
    (views cached per address, as :meth:`Plan.views`) or this call's outputs. A block of no
    rows is skipped, as the general path skips it."""
    from fusionc.runtime.comm_ops import run_comm_op
    params = {p.name: p for p in cg.host.params}
    cache: dict = {}

    def view(v, objs):
        got = fixed.get(v.name)
        if got is not None:
            return got
        p = params.get(v.name)
        return arrays.unchecked_view(objs[index[v.name]], p or v,
                                     cache if p is not None else None)
    if 0 in op.results[0].type.concrete(env):
        return lambda ptrs, stream: None

    def step(ptrs, stream):
        objs = current[0]
        views = {v.name: view(v, objs) for v in op.operands}
        run_comm_op(cg, op, views, {}, env, torch_mode, None, arrays.current_stream(torch_mode),
                    lambda r: (objs[index[r.name]], view(r, objs)))
    return step


def _gemm_step(op, env, device, index, out):
    """``out = x · wᵀ`` of ``library_call`` op (operands and result contiguous: arguments
    that passed their checks, or buffers allocated by the plan)."""
    from fusionc.runtime.library import gemm_plan
    x, w = op.operands
    T, K = x.type.concrete(env)
    run = gemm_plan(T, K, w.type.concrete(env)[0], x.type.dtype.value, device,
                    op.result.type.dtype.value)
    ix, iw = index[x.name], index[w.name]

    def step(ptrs, stream):
        run(stream, ptrs[ix], ptrs[iw], ptrs[out])
    return step
