"""``fusionc.compile``: a graph in, a GPU callable out.

Contract (docs/ARCHITECTURE.md): sizes, dtypes, grids and tiles are fixed at compile time; KV lengths,
positions, ``seq_lens`` and cache pointers are run-time arguments; the batch is bucketed — a
callable compiled for ``max_batch = 8`` serves every batch of 1..8 with the same kernels, so one
decode-step CUDA graph can be replayed without recompiling. Kernels launch on the caller's current
stream (PyTorch's when the arguments are torch tensors, else CuPy's) and are capturable in a CUDA
graph. KV caches are updated in place; other outputs are allocated like the inputs unless given.
"""
from __future__ import annotations

import math

from fusionc.errors import InputError
from fusionc.ir.nodes import Graph, Module, Value
from fusionc.runtime import arrays
from fusionc.runtime.compile_args import (check_kinds, check_lowering, check_options,
                                          check_split_options, pick_graph, tuned_v2,
                                          check_launches_only)
from fusionc.runtime.plan import tuple_getter
from fusionc.runtime.pipelines import v2_default_pipeline


def compile(program, graph: str | None = None, *, max_batch: int = 8,
            kv_len: int = 4096, pipeline: str | None = None,
            codegen=None, autotune: bool = False, progress=None,
            pdl: bool = False, comm=None, split_tokens: int | None = None,
            min_split_tokens: int = 4096, side_ctas: int = 32,
            lowering: str | None = None, cluster=None, scheme=None) -> CompiledGraph:
    """Lower, fuse, generate and compile ``program`` for the GPU.

    Args:
        program: a Module (one graph, or pick it with ``graph``) or a DSL-traced module.
        max_batch: the batch bucket: the largest batch the kernels accept.
        kv_len: the KV length a tuned choice is stored for (any length runs).
        pipeline: a pipeline string overriding the default built from these options.
        codegen: :class:`fusionc.codegen.CodegenOptions` (e.g. ``gemv_unroll``), or its
            string form ``"gemv_unroll=8,..."`` (``fusionc.codegen.context.parse_codegen_options``).
        autotune: search the choices on the GPU when none is stored (``fusionc.tune``): the
            path (fused 64- or 128-row tiles, chained or not, the library path, the mixed
            path). When ``pipeline`` is left open, a stored choice for this graph and GPU is
            used; otherwise the cost table decides.
        progress: a callable(str) told about each kernel as it compiles (e.g. tqdm.write).
        pdl: programmatic dependent launch (``CodegenOptions.pdl``): each kernel may start
            while the previous kernel of the stream drains (decode steps of many layers).
        comm: a :class:`fusionc.comm.Communicator` for graphs with tensor-parallel collectives
            (``all_reduce`` and its fused forms); it can also be given later (``.comm = ...``).
            Its errors surface at the next call or ``comm.check()``.
        split_tokens: graphs of many tokens (``max_batch`` >= 256, no attention) lower their
            linear layers to cuBLAS (pass ``lower-library``) and, with collectives, are cut into
            this many token blocks whose all-reduces overlap the next block's GEMMs (pass
            ``split-tokens``); None: 2 with collectives, else 1.
        min_split_tokens: below this many tokens a call runs as one block (its collective on the
            compute stream, as without a split). Measured on two H200s
            (BENCHMARKS.md, token-split table): splitting pays from 2048 tokens for the
            O projection and only at 8192 for the MLP, whose all-reduce is already ~2% of it.
        side_ctas: CTAs of the side stream's all-reduce (beside the GEMMs; 32 measured better
            than 16).
        lowering: ``"v2"``, None or ``"auto"`` (the same: design v2, streamed persistent
            kernels over every SM, fused up to the batch bucket the fused kernels take unless
            the cost table measured the library path faster, the mixed path for attention
            graphs past it or with ops the fused kernels do not absorb, the library path
            otherwise: :func:`fusionc.runtime.pipelines.v2_default_pipeline`). ``"v1"``, the
            cluster kernels of the first design, was removed (issues 22 and 24): an
            InputError.
        cluster, scheme: lowering v1's options, removed with it: an InputError when given.
    Returns:
        A :class:`CompiledGraph`; compiling needs no GPU, calling it does.
    Raises:
        InputError: an argument of the wrong type or out of range.
        VerifyError: a float attribute that does not survive as fp32 (``fusionc.ir.fp32``).
        PassError, LoweringError: the graph cannot be lowered with these options.
        CompileError: code generation or NVRTC failed.
    """
    from fusionc.codegen.compile import compile_kernel
    from fusionc.ir.fp32 import check_fp32_attrs
    from fusionc.passes import run_pipeline
    check_options(program, max_batch, kv_len)
    check_split_options(split_tokens, min_split_tokens, side_ctas)
    codegen = check_kinds(codegen, progress, pipeline, pdl, autotune)
    check_lowering(lowering, pipeline, cluster, scheme)
    module = program if isinstance(program, Module) else Module((program,))
    name = pick_graph(module, graph)
    check_fp32_attrs(module[name])
    if pipeline is None:
        pipeline = tuned_v2(module[name], max_batch, kv_len, autotune, split_tokens) or \
            v2_default_pipeline(module[name], max_batch, split_tokens, min_split_tokens)
    if pdl:
        import dataclasses

        from fusionc.codegen import CodegenOptions
        codegen = dataclasses.replace(codegen or CodegenOptions(), pdl=True)
    lowered = run_pipeline(Module((module[name],)), pipeline)
    host = lowered[name]
    check_launches_only(host)
    kernels = {}
    for g in lowered.graphs:
        if g.kind == "kernel":
            if progress:
                progress(f"compiling {g.name}")
            kernels[g.name] = compile_kernel(g, codegen)
    return CompiledGraph(lowered, host, kernels, max_batch, comm, side_ctas)


class CompiledGraph:
    """A compiled graph: call it with the graph's inputs (by name or in order); returns the
    graph's outputs in order (torch tensors for torch inputs, else CuPy arrays)."""

    def __init__(self, module: Module, host: Graph, kernels: dict, max_batch: int, comm=None,
                 side_ctas: int = 32):
        self.module, self.host, self.kernels, self.max_batch = module, host, kernels, max_batch
        self.comm, self.side_ctas = comm, side_ctas
        self.concat_blocks = None   # token_concat blocks (fusionc.runtime.host_ops)
        self._loaded, self._side, self._captured = {}, None, []
        self._plans: dict = {}   # arrays.signature key (device first) -> plan.Plan
        self._names = tuple(p.name for p in host.params)
        self._by_name = tuple_getter(self._names)   # {name: x} -> the values in order
        self._outs = {v.name for v in host.outputs}
        self._scratch: dict = {}   # (result, dtype, torch mode, device) -> flat buffer

    @property
    def params(self) -> list[str]:
        return [p.name for p in self.host.params]

    def report(self) -> str:
        """Per kernel: grid, cluster, threads, registers, shared memory, spills."""
        return "\n".join(k.report() for k in self.kernels.values())

    def _repr_html_(self) -> str:
        from fusionc.display import compiled_html
        return compiled_html(self)

    def _repr_pretty_(self, p, cycle) -> None:
        from fusionc.display import graph_text
        p.text("..." if cycle else graph_text(self.host) + "\n" + self.report())

    def __repr__(self) -> str:
        from fusionc.display import compiled_repr
        return compiled_repr(self)

    def __call__(self, *args, outputs: dict | None = None, **kwargs):
        """Run the graph on ``args`` / ``kwargs`` (its inputs), launching on the caller's
        current stream; ``outputs``: ``{output name: buffer}`` to write into instead of new
        buffers. The first call with a new argument signature checks everything and records a
        plan (:mod:`fusionc.runtime.plan`); later calls with that signature only read the
        pointers, allocate the outputs and launch.

        Raises:
            InputError: an argument of the wrong kind, dtype, device, shape, layout or
                alignment, a missing or unexpected argument, a batch over ``max_batch``.
            DeviceError: no usable GPU, or a CUDA call failed.
        """
        if args or len(kwargs) != len(self._names):
            vals = self._ordered(args, kwargs)
        else:   # all by name, the common call: the values in parameter order in one C call
            try:
                vals = list(self._by_name(kwargs))
            except KeyError:
                vals = None
        sig = arrays.signature(vals, arrays.device_id()) if vals is not None else None
        if sig is None:
            return self._checked(args, kwargs, outputs, None)
        key = sig[0]
        plan = self._plans.get(key)
        if plan is None:
            return self._checked(args, kwargs, outputs, key)
        if plan.run is not None and outputs is None:
            return plan.run(self, vals, sig[1])
        given = dict(zip(self.params, vals))
        return self._run(given, plan.views(self, vals), dict(plan.env), plan.torch_mode,
                         outputs)

    def _ordered(self, args, kwargs) -> list | None:
        """The arguments in parameter order, or None unless they name each parameter once
        (:meth:`_named` then says what is wrong)."""
        names = self._names
        if len(args) + len(kwargs) != len(names):
            return None
        try:
            return list(args) + [kwargs[n] for n in names[len(args):]]
        except KeyError:
            return None

    def _checked(self, args, kwargs, outputs, key):
        """The checked call; records the plan of signature ``key`` when it succeeds."""
        from fusionc.runtime.plan import Plan
        given = self._named(args, kwargs)
        torch_mode = any(arrays.is_torch(x) for x in given.values())
        arrays.require_gpu()
        views = {p.name: arrays.as_cupy(given[p.name], p, self.host.name)
                 for p in self.host.params}
        env = arrays.bind(self.host.params, views, self.host.name)
        for sym, n in env.items():
            if n > self.max_batch:
                raise InputError(f"{sym} = {n} exceeds the compiled batch bucket",
                                 op=self.host.name, valid=f"{sym} <= max_batch = "
                                 f"{self.max_batch}; compile with a larger max_batch")
        bound = dict(env)
        out = self._run(given, views, env, torch_mode, outputs)
        if key is not None:
            if len(self._plans) >= 256:
                self._plans.clear()
            self._plans[key] = Plan(self, bound, torch_mode, key[0])
        return out

    def _run(self, given: dict, views: dict, env: dict, torch_mode: bool, outputs):
        """The general path of a call whose arguments passed their checks: host ops,
        collectives and launches in order (launches check their arguments)."""
        from fusionc.runtime.host_ops import Streams, run_host_op
        from fusionc.runtime.launch import LoadedKernel
        objs = dict(given)
        stream = arrays.current_stream(torch_mode)
        streams = Streams(stream, self._side_stream)
        for op in self.host.body:
            if op.name != "launch":
                run_host_op(self, op, views, objs, env, torch_mode, outputs, streams)
                continue
            streams.before(op, 0)
            k = self.module[op.attr("kernel").name]
            if k.name not in self._loaded:
                self._loaded[k.name] = LoadedKernel(self.kernels[k.name])
            tensors = {p.name: views[a.name] for p, a in zip(k.params, op.operands)}
            result_of = {v.name: r for v, r in zip(k.outputs, op.results)}
            for p in k.params[len(op.operands):]:  # pure outputs
                r = result_of[p.name]
                objs[r.name], views[r.name] = self._output(p, r.name, env, torch_mode, outputs,
                                                           views) if r.name in self._outs \
                    else self.scratch(p, r.name, env, torch_mode)
                tensors[p.name] = views[r.name]
            self._loaded[k.name].launch(tensors, env, stream=stream)
            for p, a in zip(k.params, op.operands):  # inputs updated in place (KV caches)
                if p.name in result_of:
                    r = result_of[p.name]
                    views[r.name], objs[r.name] = views[a.name], objs[a.name]
        streams.join()
        if stream.is_capturing():   # the graph's replays write into these buffers
            self._captured.append((given, views, streams.keep, streams.joined))
        return tuple(objs[v.name] for v in self.host.outputs)

    def scratch(self, param, result: str, env, torch_mode: bool):
        """``(buffer, CuPy view)`` of intermediate ``result`` (a kernel's or a host op's output
        that the graph reads again but does not return, e.g. the MLP's SwiGLU output), shaped
        for ``env``: the leading elements of one flat buffer per result, made on the first call
        and regrown only for a larger batch, so a captured step allocates nothing and memory
        stays at the largest batch seen. Like the kernels' workspace and counters, it is shared
        by the calls of this CompiledGraph, which must not run concurrently on two streams."""
        from fusionc.ir.types import TensorType
        from fusionc.runtime.arrays import _CUPY, _wrap_torch, device_id
        shape = param.type.concrete(env)
        n = math.prod(shape)
        key = (result, param.type.dtype, torch_mode, device_id())
        buf = self._scratch.get(key)
        if buf is None or (buf.numel() if torch_mode else buf.size) < n:
            flat = Value(param.name, TensorType(param.type.dtype, (max(n, 1),)))
            buf = self._scratch[key] = arrays.empty_like_inputs(flat, {}, torch_mode)[0]
        obj = buf[:n].reshape(shape)
        return obj, (_wrap_torch(obj, _CUPY[param.type.dtype]) if torch_mode else obj)

    def forget_captures(self) -> None:
        """Release the buffers kept alive for the CUDA graphs captured through this graph's
        calls (their replays write into them). Only once those graphs are destroyed:
        ``fusionc.models.Decoder.load`` calls it after dropping its captures."""
        self._captured.clear()

    def _side_stream(self):
        """The side stream of token-split overlap (created once, high priority)."""
        if self._side is None:
            import cupy

            from fusionc.runtime.launch import check, driver
            _, greatest = check(driver().cuCtxGetStreamPriorityRange(),
                                "cuCtxGetStreamPriorityRange")
            self._side = cupy.cuda.Stream(non_blocking=True, priority=int(greatest))
        return self._side

    def _named(self, args, kwargs) -> dict:
        names = self.params
        if len(args) > len(names):
            raise InputError(f"{len(args)} positional arguments", op=self.host.name,
                             valid=f"at most {len(names)}: {', '.join(names)}")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in given:
                raise InputError(f"unexpected or repeated argument '{k}'", op=self.host.name,
                                 valid=", ".join(names))
            given[k] = v
        missing = [n for n in names if n not in given]
        if missing:
            raise InputError(f"missing arguments {missing}", op=self.host.name,
                             valid=", ".join(names))
        return given

    def _output(self, param, result: str, env, torch_mode, outputs, inputs: dict):
        if outputs is not None and not isinstance(outputs, dict):
            raise InputError(f"outputs= is a {type(outputs).__name__}", op=self.host.name,
                             valid="a dict {output name: tensor}")
        want = (outputs or {}).get(result)
        if want is not None:
            view = arrays.as_cupy(want, param, self.host.name)
            for name, other in inputs.items():
                if _overlap(view, other):
                    raise InputError(f"output '{result}' overlaps argument '{name}'",
                                     op=self.host.name, valid="a separate output buffer "
                                     "(kernels read all inputs while writing outputs)")
            if tuple(view.shape) != param.type.concrete(env):
                raise InputError(f"output '{result}' has shape {list(view.shape)}",
                                 op=self.host.name, valid=f"{param.type} with {env}")
            return want, view
        return arrays.empty_like_inputs(param, env, torch_mode)




def _overlap(a, b) -> bool:
    """Whether two device arrays share bytes."""
    a0, b0 = a.data.ptr, b.data.ptr
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes
