"""Run-time arguments: CuPy arrays and PyTorch tensors (zero-copy views), checked against the
IR types, and outputs allocated like the inputs.

bf16 has no CuPy dtype: bf16 PyTorch tensors travel as their 16-bit patterns, and CuPy callers
pass bf16 data as ``uint16`` bit patterns (``fusionc.runtime.transfer`` converts from numpy).
"""
from __future__ import annotations

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


def _wrap_torch(t, dtype: str):
    """A zero-copy CuPy view of contiguous CUDA tensor ``t`` (kept alive by the view).

    Not through ``cupy.from_dlpack``: DLPack's stream handshake makes CuPy's stream wait on
    PyTorch's, which is illegal while PyTorch captures a CUDA graph; the pointer is valid on
    every stream, and fusionc launches on PyTorch's current stream anyway.
    """
    import cupy
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), t.numel() * t.element_size(), owner=t,
                                  device_id=t.device.index)
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
        return t, as_cupy(t, v, "output")
    a = cupy.empty(shape, dtype=_CUPY[v.type.dtype])
    return a, a


def current_stream(torch_mode: bool):
    """The caller's current stream as a CuPy stream (PyTorch's when given torch tensors)."""
    import cupy
    if torch_mode:
        import warnings

        import torch
        with warnings.catch_warnings():  # CuPy 14 deprecates the name, not the behaviour
            warnings.simplefilter("ignore", DeprecationWarning)
            return cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    return cupy.cuda.get_current_stream()


def require_gpu() -> None:
    """DeviceError unless CuPy sees a CUDA device."""
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, an old driver (cudaErrorInsufficientDriver), no GPU
        raise DeviceError(f"no usable CUDA GPU ({type(e).__name__}: {e})",
                          valid="an sm_90 GPU (H100, H200) with a CUDA 13 driver") from None
