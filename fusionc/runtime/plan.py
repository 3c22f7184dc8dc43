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

Graphs of kernel launches and GEMMs without a bias (``library_call``) run fully planned. Graphs
with a biased GEMM, other host ops or collectives, and calls given ``outputs=``, run the
general path with the signature's checks and dims reused (:meth:`Plan.views`: CuPy views of
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

    ``run`` is None unless the host graph is kernel launches only; otherwise it is
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


def _planned_run(cg, env, torch_mode, device):
    """The fast ``run(cg, args, ptrs)`` of a host graph of kernel launches and GEMMs
    (``library_call``) only; None for other graphs."""
    host = cg.host
    if any(op.name not in ("launch", "library_call") or
           op.name == "library_call" and len(op.operands) > 2
           for op in host.body):   # a GEMM with a bias takes the checked path
        return None
    index = {p.name: i for i, p in enumerate(host.params)}
    allocs, steps = [], []

    def output(v, r):   # result r's buffer (typed like v): per call, or the graph's scratch
        index[r.name] = len(host.params) + len(allocs)
        if r.name in cg._outs:
            allocs.append(arrays.allocator(v, env, torch_mode, device))
        else:   # an intermediate: the graph's scratch buffer (CompiledGraph.scratch)
            obj, view = cg.scratch(v, r.name, env, torch_mode)
            ptr = obj.data_ptr() if torch_mode else obj.data.ptr
            allocs.append(lambda obj=obj, ptr=ptr: (obj, ptr))
        return index[r.name]

    for op in host.body:
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
        for alloc in allocs:
            obj, ptr = alloc()
            args.append(obj)
            ptrs.append(ptr)
        for step in steps:
            step(ptrs, stream)
        if capturing(stream):  # the graph's replays write into these buffers
            cg._captured.append(tuple(args))
        return result(args)
    return run


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
