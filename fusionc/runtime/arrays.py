"""Run-time arguments: CuPy arrays and PyTorch tensors (zero-copy views), checked against the
IR types, and outputs allocated like the inputs.

bf16 has no CuPy dtype: bf16 PyTorch tensors travel as their 16-bit patterns, and CuPy callers
pass bf16 data as ``uint16`` bit patterns (``fusionc.runtime.transfer`` converts from numpy).
"""
from __future__ import annotations

from functools import reduce
from operator import attrgetter, or_

from fusionc.errors import DeviceError, InputError
from fusionc.ir.nodes import Value
from fusionc.ir.types import DType

_TORCH = {DType.f16: "float16", DType.bf16: "bfloat16", DType.f32: "float32",
          DType.i32: "int32", DType.i64: "int64", DType.f64: "float64"}
_CUPY = {DType.f16: "float16", DType.bf16: "uint16", DType.f32: "float32", DType.i32: "int32",
         DType.i64: "int64", DType.f64: "float64"}


def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def as_cupy(x, p: Value, where: str):
    """A CuPy view of argument ``x`` for parameter ``p`` after checking dtype, device, layout and
    alignment. Raises InputError naming the argument and what is valid."""
    import cupy
    dt = p.type.dtype
    if is_torch(x):
        if not x.is_cuda or x.device.index != cupy.cuda.Device().id:
            raise InputError(f"argument '{p.name}' is on {x.device}", op=where,
                             valid=f"a CUDA tensor on the current device "
                                   f"cuda:{cupy.cuda.Device().id} ({p.type})")
        if str(x.dtype) != "torch." + _TORCH[dt]:
            raise InputError(f"argument '{p.name}' has dtype {x.dtype}", op=where,
                             valid=f"torch.{_TORCH[dt]} for {p.type}")
        _layout(x.is_contiguous(), x.data_ptr(), p, where)
        return _wrap_torch(x, _CUPY[dt])
    if not isinstance(x, cupy.ndarray):
        raise InputError(f"argument '{p.name}' is a {type(x).__name__}", op=where,
                         valid="a CuPy array or a PyTorch CUDA tensor")
    if x.dtype != cupy.dtype(_CUPY[dt]):
        raise InputError(f"argument '{p.name}' has dtype {x.dtype}", op=where,
                         valid=f"{_CUPY[dt]} for {p.type}" + (" (bf16 bits)" if dt == DType.bf16
                                                              else ""))
    if x.device.id != cupy.cuda.Device().id:
        raise InputError(f"argument '{p.name}' is on GPU {x.device.id}", op=where,
                         valid=f"the current device {cupy.cuda.Device().id}")
    _layout(x.flags.c_contiguous, x.data.ptr, p, where)
    return x


def _wrap_torch(t, dtype: str, owner=True):
    """A zero-copy CuPy view of contiguous CUDA tensor ``t`` (kept alive by the view unless
    ``owner`` is false).

    Not through ``cupy.from_dlpack``: DLPack's stream handshake makes CuPy's stream wait on
    PyTorch's, which is illegal while PyTorch captures a CUDA graph; the pointer is valid on
    every stream, and fusionc launches on PyTorch's current stream anyway.
    """
    import cupy
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), t.numel() * t.element_size(),
                                  owner=t if owner else None, device_id=t.device.index)
    return cupy.ndarray(tuple(t.shape), dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))


def _layout(contiguous: bool, ptr: int, p: Value, where: str) -> None:
    if not contiguous:
        raise InputError(f"argument '{p.name}' is not contiguous", op=where,
                         valid="a C-contiguous (row-major) tensor; call .contiguous()")
    if ptr % 16:
        raise InputError(f"argument '{p.name}' is not 16-byte aligned (address {ptr:#x})",
                         op=where, valid="a 16-byte aligned buffer (a fresh allocation)")


def bind(params, cupy_args: dict, where: str) -> dict[str, int]:
    """Symbolic dims from the argument shapes; InputError on a mismatch."""
    from fusionc.ir.types import bind_shapes
    return bind_shapes(params, {p.name: cupy_args[p.name].shape for p in params}, where)


def empty_like_inputs(v: Value, env: dict[str, int], torch_mode: bool):
    """A new output buffer for ``v``: a torch tensor when the inputs were torch tensors."""
    import cupy
    shape = v.type.concrete(env)
    if torch_mode:
        import torch
        t = torch.empty(shape, dtype=getattr(torch, _TORCH[v.type.dtype]), device="cuda")
        if t.get_device() != cupy.cuda.runtime.getDevice():
            return t, as_cupy(t, v, "output")   # its error
        return t, _wrap_torch(t, _CUPY[v.type.dtype])   # fresh: contiguous and aligned
    a = cupy.empty(shape, dtype=_CUPY[v.type.dtype])
    return a, a


_EXTERNAL: dict = {}   # (stream handle, device) -> cupy.cuda.ExternalStream


def current_stream(torch_mode: bool):
    """The caller's current stream as a CuPy stream (PyTorch's when given torch tensors; its
    CuPy wrapper is made once per stream handle and device)."""
    import cupy
    if not torch_mode:
        return cupy.cuda.get_current_stream()
    return external_stream(stream_getter(True)(), cupy.cuda.runtime.getDevice())


def external_stream(handle: int, device: int):
    """The CuPy stream of raw stream ``handle`` on ``device`` (made once per pair)."""
    import cupy
    key = (handle, device)
    s = _EXTERNAL.get(key)
    if s is None:
        import warnings
        with warnings.catch_warnings():  # CuPy 14 deprecates the name, not the behaviour
            warnings.simplefilter("ignore", DeprecationWarning)
            s = cupy.cuda.ExternalStream(key[0])
        if len(_EXTERNAL) >= 64:
            _EXTERNAL.clear()
        _EXTERNAL[key] = s
    return s


def stream_getter(torch_mode: bool):
    """A function of no arguments giving the handle (int) of the caller's current stream:
    PyTorch's current stream on its current device when given torch tensors, else CuPy's."""
    if torch_mode:
        import torch
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        dev = getattr(torch._C, "_cuda_getDevice", None)
        if raw is not None and dev is not None:
            return lambda: raw(dev())
        current = torch.cuda.current_stream
        return lambda: current().cuda_stream
    import cupy
    get = cupy.cuda.get_current_stream
    return lambda: get().ptr


def is_capturing(stream: int) -> bool:
    """Whether stream handle ``stream`` is capturing a CUDA graph."""
    import cupy
    return cupy.cuda.runtime.streamIsCapturing(stream) != 0


def device_id() -> int:
    """CuPy's current device (the device arguments must be on); DeviceError (as
    :func:`require_gpu`'s) without a usable GPU."""
    import cupy
    try:
        return cupy.cuda.runtime.getDevice()
    except cupy.cuda.runtime.CUDARuntimeError:
        require_gpu()   # names the missing or unusable GPU
        raise


_SIG: dict = {}  # argument type -> its signature function (None: not an array fusionc takes)


def _torch_sig(x, key: list) -> int:
    p = x.data_ptr()
    key += (x.dtype, x.get_device(), x.shape, x.is_contiguous(), p & 15)
    return p


def _cupy_sig(x, key: list) -> int:
    d = x.data
    p = d.ptr
    key += (x.dtype, d.device_id, x.shape, x.strides, p & 15)
    return p


_FAST: dict = {}  # torch tensor type -> its (data_ptr, get_device, is_contiguous) methods


def _sig_function(t):
    if t.__module__.startswith("torch"):
        f = _torch_sig
        if all(hasattr(t, m) for m in ("data_ptr", "get_device", "is_contiguous")):
            _FAST[t] = (t.data_ptr, t.get_device, t.is_contiguous)
    else:
        import cupy
        f = _cupy_sig if issubclass(t, cupy.ndarray) else None
    _SIG[t] = f
    return f


def signature(values, device: int) -> tuple | None:
    """``(key, pointers)`` of argument list ``values`` on current device ``device``: ``key`` is
    a flat hashable tuple that fixes everything :func:`as_cupy` and :func:`bind` check (array
    kind, dtype, device, shape, layout, alignment of the address), ``pointers`` the device
    address of each. None when an argument is not a CuPy array or a torch tensor (or its
    attributes cannot be read): the checked path then says what is wrong.

    All-torch arguments (the common case) are read attribute by attribute over the whole list
    with ``map`` (no bytecode per argument; this is most of a planned call's host time,
    BENCHMARKS.md "host overhead"), and their alignment is one OR of the addresses: any
    misaligned one changes the key, and a misaligned call never records a plan."""
    fast = None
    if values:
        t = type(values[0])
        fast = _FAST.get(t)
        if fast is None and t not in _SIG:   # first sight of this type: the same key at once
            _sig_function(t)
            fast = _FAST.get(t)
    if fast is not None:
        ptr, dev, contiguous = fast
        try:
            ptrs = list(map(ptr, values))   # TypeError / AttributeError unless all tensors
            return (device, "torch", tuple(map(_DTYPE, values)), tuple(map(dev, values)),
                    tuple(map(_SHAPE, values)), tuple(map(contiguous, values)),
                    reduce(or_, ptrs, 0) & 15), ptrs
        except Exception:  # noqa: BLE001 (a CuPy array among them, a sparse tensor)
            pass
    key, ptrs = [device], []
    try:
        for x in values:
            f = _SIG.get(type(x), 0)
            if f == 0:
                f = _sig_function(type(x))
            if f is None:
                return None
            ptrs.append(f(x, key))
    except Exception:  # noqa: BLE001 (e.g. a sparse tensor has no data_ptr)
        return None
    return tuple(key), ptrs


_DTYPE, _SHAPE = attrgetter("dtype"), attrgetter("shape")


def unchecked_view(x, p: Value, cache: dict | None = None):
    """The CuPy view of argument ``x`` for parameter ``p`` whose signature passed
    :func:`as_cupy` before: a torch tensor's view is made without its checks (and, given
    ``cache``, kept there per address without owning the tensor); a CuPy array is itself."""
    if not is_torch(x):
        return x
    if cache is None:
        return _wrap_torch(x, _CUPY[p.type.dtype])
    key = (p.name, x.data_ptr())
    v = cache.get(key)
    if v is None:
        if len(cache) >= 256:
            cache.clear()
        v = cache[key] = _wrap_torch(x, _CUPY[p.type.dtype], owner=False)
    return v


def allocator(v: Value, env: dict[str, int], torch_mode: bool, device: int):
    """A function of no arguments allocating a new output buffer for ``v`` (like
    :func:`empty_like_inputs`) on ``device``: returns ``(buffer, device pointer)``. (Outputs
    carved from one block were ~2-4 µs faster but behave unlike fresh tensors under autograd
    and inference mode: BENCHMARKS.md, host overhead.)"""
    shape = v.type.concrete(env)
    if not torch_mode:
        import cupy
        empty, dt = cupy.empty, cupy.dtype(_CUPY[v.type.dtype])

        def alloc_cupy():
            a = empty(shape, dt)
            return a, a.data.ptr
        return alloc_cupy
    import torch
    empty, dt = torch.empty, getattr(torch, _TORCH[v.type.dtype])
    dev = torch.device("cuda", device)

    def alloc_torch():
        t = empty(shape, dtype=dt, device=dev)
        return t, t.data_ptr()
    return alloc_torch


def require_gpu() -> None:
    """DeviceError unless CuPy sees a CUDA device."""
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, an old driver (cudaErrorInsufficientDriver), no GPU
        raise DeviceError(f"no usable CUDA GPU ({type(e).__name__}: {e})",
                          valid="an sm_90 GPU (H100, H200) with a CUDA 13 driver") from None
