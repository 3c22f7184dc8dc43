"""Load a cubin and launch a generated kernel with its cluster shape (``cuda.bindings.driver``).

CuPy cannot launch with a run-time cluster size or the non-portable size 16, so launches go
through ``cuLaunchKernelEx``: grid ``grid * cluster`` CTAs, cluster dims as a launch attribute
when the source does not fix them (``__cluster_dims__`` is used for sizes 2..8), dynamic shared
memory raised with ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``, and for size 16
``CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED``. Launches go on the current CuPy stream.
Every driver call is checked; a failure raises :class:`fusionc.errors.DeviceError` naming the
CUDA error.
"""
from __future__ import annotations

from fusionc.codegen.compile import CompiledKernel
from fusionc.errors import DeviceError, InputError
from fusionc.runtime.params import ArgPack, PackContext, check_dim


def driver():
    """The ``cuda.bindings.driver`` module (DeviceError if it is not installed)."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise DeviceError(f"cuda-bindings is not installed ({e})",
                          valid="pip install 'cuda-bindings>=13.0,<14'") from None
    return cu


def check(result, what: str):
    """Unpack a cuda-bindings result tuple; DeviceError with the CUDA error name on failure."""
    cu = driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        name = name.decode() if isinstance(name, bytes) else str(name)
        raise DeviceError(f"{what} failed: {name}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def ensure_device() -> None:
    """Make CuPy's context current and refuse GPUs that are not sm_90 (Hopper)."""
    try:
        import cupy
        cupy.cuda.runtime.free(0)  # creates the primary context and makes it current
        cc = cupy.cuda.Device().compute_capability
    except Exception as e:  # no driver, no GPU
        raise DeviceError(f"no usable CUDA GPU ({type(e).__name__}: {e})") from None
    version = check(driver().cuDriverGetVersion(), "cuDriverGetVersion")
    if version < 13000:
        raise DeviceError(f"CUDA driver {version // 1000}.{version % 1000 // 10} is too old",
                          valid="a CUDA 13 driver (580 series or newer)")
    if cc != "90":
        raise DeviceError(f"compute capability {cc[:-1]}.{cc[-1]}",
                          valid="an sm_90 GPU (H100, H200): kernels are built for sm_90a")


def _sm_count() -> int | None:
    """SMs of the current GPU (None if CuPy cannot tell: the barrier's trap stays the guard)."""
    import cupy
    dev = cupy.cuda.Device()
    for get in (lambda: dev.attributes["MultiProcessorCount"],
                lambda: cupy.cuda.runtime.getDeviceProperties(dev.id)["multiProcessorCount"]):
        try:
            return int(get())
        except Exception:  # noqa: BLE001 (attribute names differ between CuPy versions)
            continue
    return None


def _same(values):
    return values


def grid_config(stream: int, ctas: int, threads: int, smem_bytes: int = 0):
    """A plain 1D ``CUlaunchConfig``: ``ctas`` CTAs of ``threads`` threads with ``smem_bytes``
    of dynamic shared memory on stream handle ``stream`` (no attributes)."""
    cu = driver()
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = ctas, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
    cfg.sharedMemBytes, cfg.hStream = smem_bytes, cu.CUstream(stream)
    return cfg


def _launch_config(src, stream: int, query: bool = False, blocks: int | None = None):
    """The ``CUlaunchConfig`` of kernel ``src`` on stream handle ``stream``: ``src.blocks`` CTAs
    of ``src.threads`` threads, its dynamic shared memory, the cluster dimension as an attribute
    unless the source fixes it, and programmatic stream serialization for PDL builds. ``query``:
    for ``cuOccupancyMaxActiveClusters`` (clusters of 2 or more; it counts 0 clusters for a
    launch without one), which takes the cluster dimension always and no PDL. ``blocks``: the
    CTAs of a persistent kernel's launch (:func:`persistent_grid`), else ``src.blocks``."""
    cu = driver()
    cfg = grid_config(stream, blocks or src.blocks, src.threads, src.smem_bytes)
    attrs = []
    if src.cluster > 1 and (query or not src.cluster_dims_in_source):
        a = cu.CUlaunchAttribute()
        a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = src.cluster, 1, 1
        attrs.append(a)
    if src.pdl and not query:  # may start while the previous kernel of the stream drains
        a = cu.CUlaunchAttribute()
        a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        a.value.programmaticStreamSerializationAllowed = 1
        attrs.append(a)
    if attrs:
        cfg.attrs, cfg.numAttrs = attrs, len(attrs)
    return cfg


def _check_occupancy(src, function) -> None:
    """Refuse a kernel that needs its whole grid resident (grid barrier, parallel grid_reduce)
    where the driver's occupancy query (``cuOccupancyMaxActiveClusters``: registers, shared
    memory, threads, SMs and cluster placement of this GPU) holds fewer clusters than the grid
    (the compiler assumed ``H200.resident`` at the kernel's CTAs per SM; an H100 PCIe or a MIG
    slice may hold fewer) instead of trapping in the barrier. Other kernels sharing the GPU at
    the same time (MPS, concurrent streams) can still keep CTAs out: the barrier's bounded spin
    then traps after 2 s rather than hang."""
    if not src.resident or src.persistent_units:   # a persistent grid is the resident CTAs
        return
    cu = driver()
    if src.cluster > 1:
        n = check(cu.cuOccupancyMaxActiveClusters(function, _launch_config(src, 0, True)),
                  f"cuOccupancyMaxActiveClusters of {src.name}")
    else:  # no cluster launch: CTAs per SM times SMs
        per_sm = check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            function, src.threads, src.smem_bytes), f"the occupancy of {src.name}")
        sms = _sm_count()
        n = per_sm * sms if sms is not None else src.grid  # unknown: the barrier's trap guards
    if n < src.grid:
        raise DeviceError(f"{src.name} needs its {src.grid} clusters of {src.cluster} resident at "
                          f"once (grid barrier or parallel grid_reduce) but this GPU holds {n}",
                          valid="an H200 or H100 SXM with no other work on it, or "
                                "CodegenOptions(grid_reduce_parallel=0)")


def persistent_grid(src, function, override: int | None = None) -> int:
    """CTAs of a streamed persistent kernel's launch: every CTA the GPU holds at once
    (``cuOccupancyMaxActiveBlocksPerMultiprocessor`` × SMs), at most its units and the grid it
    was compiled for (its split-K workspace); ``override`` (tests: a grid larger than the GPU
    holds, which must still finish, or a small one) replaces the occupancy."""
    from fusionc.stream.schedule import UnitSchedule
    if override is not None:
        capacity = override
    else:
        per_sm = check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(
            function, src.threads, src.smem_bytes), f"the occupancy of {src.name}")
        capacity = max(1, per_sm) * (_sm_count() or 132)
    return UnitSchedule.launch_grid(src.persistent_units, min(capacity, src.grid))


class LoadedKernel:
    """A compiled kernel loaded into the current context, with its global workspace.

    The grid_reduce workspace and arrival counters are allocated and zeroed once, here, and the
    device is synchronized so that no launch on any stream can see them before they are zero
    (so load, i.e. call once, before capturing a CUDA graph); every launch leaves the counters
    zero, so launches and graph replays need no reset. One LoadedKernel must not run on two
    streams at the same time (they would share the counters), nor be launched from two threads
    at once (its packed arguments are rewritten by every launch).

    :meth:`launch` checks its arguments; :meth:`pack` and :meth:`launcher` are the
    cached path of :class:`fusionc.runtime.compiled.CompiledGraph` (arguments packed once per
    run-time dims, the launch configuration built once per stream).
    """

    def __init__(self, compiled: CompiledKernel):
        import cupy
        ensure_device()
        cu = driver()
        self.compiled = compiled
        src = compiled.source
        self.module = check(cu.cuModuleLoadData(compiled.cubin), "cuModuleLoadData")
        self.function = check(cu.cuModuleGetFunction(self.module, src.name.encode()),
                              "cuModuleGetFunction")
        attr = cu.CUfunction_attribute
        check(cu.cuFuncSetAttribute(self.function,
                                    attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    src.smem_bytes), "setting the dynamic shared memory size")
        if src.nonportable:
            check(cu.cuFuncSetAttribute(
                self.function, attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                "allowing the non-portable cluster size 16")
        _check_occupancy(src, self.function)
        self._grid = persistent_grid(src, self.function) if src.persistent_units else None
        self.workspace = cupy.zeros(max(src.workspace_floats, 1), cupy.float32)
        self.counters = cupy.zeros(max(src.counters, 1), cupy.uint32)
        cupy.cuda.Device().synchronize()  # zeroed before any stream launches the kernel
        self._launch = cu.cuLaunchKernelEx
        self._symbols = tuple(p.symbol for p in src.params if p.kind == "dim")
        self._packs: dict = {}     # (dims, delay) -> ArgPack
        self._configs: dict = {}   # stream handle -> CUlaunchConfig

    def launch(self, tensors: dict, dims: dict[str, int], delay: tuple[int, int] = (-1, 0),
               stream=None) -> None:
        """Launch once, checking every argument.

        Args:
            tensors: IR parameter name -> CuPy array (C-contiguous, 16-byte aligned, dtype
                matching the parameter; bf16 as uint16 bits).
            dims: symbolic dim -> run-time size (at most the kernel's max_batch).
            delay: (rank, nanoseconds) for debug builds (``CodegenOptions(delay=True)``).
            stream: a CuPy stream (default: the current one).
        Raises:
            InputError: a missing argument or a dim over max_batch. DeviceError: launch failed.
        """
        import cupy
        pack = self._packs.get((tuple(dims.get(s) for s in self._symbols), tuple(delay)))
        ptrs = None if pack is None else _checked_pointers(pack, tensors)
        if ptrs is None:   # the checks, in parameter order, with their errors
            src = self.compiled.source
            by_name = {}
            for p in src.params:
                if p.kind == "tensor":
                    by_name[p.value.name] = self._tensor(p.value, tensors, dims)
                elif p.kind == "dim":
                    check_dim(p, dims, src)
            pack = self.pack(dims, delay)
            ptrs = [by_name[n] if n in by_name else _pointer(tensors[n]) for n in pack.names]
        stream = stream or cupy.cuda.get_current_stream()
        self.launch_packed(pack, ptrs, stream.ptr)

    def pack(self, dims: dict[str, int], delay: tuple[int, int] = (-1, 0)) -> ArgPack:
        """The kernel's arguments packed for run-time ``dims`` and ``delay`` (cached; built
        once per distinct value), to launch with :meth:`launch_packed`. InputError for a dim
        that is missing or over max_batch."""
        key = (tuple(dims.get(s) for s in self._symbols), tuple(delay))
        pack = self._packs.get(key)
        if pack is None:
            ctx = PackContext(self.compiled.source, self.workspace.data.ptr,
                              self.counters.data.ptr, dict(dims), tuple(delay))
            pack = ArgPack(self.compiled.source.params, ctx)
            pack.skip = bool(self.compiled.source.persistent_units) and any(
                dims.get(s) == 0 for s in self._symbols)
            tensor = {p.value.name: p.value for p in self.compiled.source.params
                      if p.kind == "tensor"}
            pack.expect = [(_shape(tensor[n], dims), tensor[n].type.dtype.itemsize)
                           if n in tensor else None for n in pack.names]
            if len(self._packs) >= 256:
                self._packs.clear()
            self._packs[key] = pack
        return pack

    def launch_packed(self, pack: ArgPack, ptrs, stream: int) -> None:
        """Launch with ``pack`` (from :meth:`pack`) and the device pointers ``ptrs`` of
        ``pack.names`` on stream handle ``stream``, unchecked: the caller has checked the
        arguments (shapes, dtypes, layout and alignment). DeviceError if the launch fails."""
        self.launcher(pack, _same)(ptrs, stream)

    def launcher(self, pack: ArgPack, get):
        """A closure ``go(values, stream)`` launching with ``pack`` and the pointers
        ``get(values)`` (the planned call's path: one Python frame per launch; Python frames are
        a third of a call's host time on a slow host CPU). Nothing for a persistent kernel over
        an empty batch."""
        if pack.skip:
            return lambda values, stream: None
        fill, configs, launch = pack.fill, self._configs, self._launch
        fn, address, what = self.function, pack.address, f"launching {self.compiled.source.name}"
        plain = pack.plain_only

        def go(values, stream):
            if plain is not None:
                plain[:] = get(values)
            else:
                fill(get(values))
            cfg = configs.get(stream)
            r = launch(cfg if cfg is not None else self._config(stream), fn, address, 0)
            if r[0]:
                check(r, what)
        return go

    def _config(self, stream: int):
        """The launch configuration on stream handle ``stream`` (built once per stream)."""
        if len(self._configs) >= 64:
            self._configs.clear()
        cfg = self._configs[stream] = _launch_config(self.compiled.source, stream,
                                                     blocks=self._grid)
        return cfg

    @property
    def grid(self) -> int | None:
        """CTAs of a persistent kernel's launches (:func:`persistent_grid`); None otherwise.
        Tests set it (e.g. to more CTAs than the GPU holds at once)."""
        return self._grid

    @grid.setter
    def grid(self, n: int) -> None:
        src = self.compiled.source
        top = min(src.grid, src.persistent_units)
        why = "its units and the workspace it was compiled for"
        if src.persistent_units and src.resident:   # phases wait on each other's CTAs
            top = persistent_grid(src, self.function)
            why += ", and the CTAs this GPU holds at once (its phases wait on each other)"
        if not src.persistent_units or isinstance(n, bool) or not isinstance(n, int) \
                or not 1 <= n <= top:
            raise InputError(f"a grid of {n!r} CTAs for {src.name}", op=src.name,
                             valid=f"a persistent kernel's grid from 1 to {top} ({why})")
        self._grid = n
        self._configs.clear()

    def errors(self) -> int:
        """The error word of a streamed kernel's counters (non-zero: a counter wait timed out;
        the results of that launch are not valid, and units that finished after the timeout
        may have left counts behind: load the kernel again before trusting another launch).
        Synchronizes the device."""
        import cupy
        if not self.compiled.source.persistent_units:
            return 0
        cupy.cuda.Device().synchronize()
        return int(self.counters[-1].get())

    def _tensor(self, v, tensors, dims) -> int:
        """The device pointer of parameter ``v``; InputError unless the array has the
        parameter's shape and element size, is C-contiguous and 16-byte aligned."""
        name = self.compiled.source.name
        if v.name not in tensors:
            raise InputError(f"missing argument %{v.name}", op=name)
        a = tensors[v.name]
        shape = tuple(d if isinstance(d, int) else dims.get(d, -1) for d in v.type.shape)
        if tuple(a.shape) != shape or a.dtype.itemsize != v.type.dtype.itemsize:
            raise InputError(f"%{v.name} is {a.dtype}{list(a.shape)}", op=name,
                             valid=f"{v.type} with {dims}")
        if not a.flags.c_contiguous:
            raise InputError(f"%{v.name} is not C-contiguous", op=name,
                             valid="a contiguous array (e.g. cupy.ascontiguousarray(x))")
        if a.data.ptr % 16:
            raise InputError(f"%{v.name} starts at an address that is not 16-byte aligned",
                             op=name, valid="16-byte aligned tensors (generated code moves "
                             "16-byte vectors); allocations are, views may not be")
        return a.data.ptr


def _shape(v, dims) -> tuple:
    return tuple(d if isinstance(d, int) else dims.get(d, -1) for d in v.type.shape)


def _pointer(a) -> int:
    return a.data.ptr


def _checked_pointers(pack: ArgPack, tensors: dict) -> list | None:
    """The device pointers of ``pack.names`` in ``tensors`` when every tensor has its expected
    shape and element size and is C-contiguous and 16-byte aligned; None otherwise (the
    parameter-by-parameter checks then raise the error)."""
    out = []
    for n, want in zip(pack.names, pack.expect):
        a = tensors.get(n)
        if a is None:
            return None
        p = a.data.ptr
        if want is not None and (a.shape != want[0] or a.dtype.itemsize != want[1] or p & 15
                                 or not a.flags.c_contiguous):
            return None
        out.append(p)
    return out
