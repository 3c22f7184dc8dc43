"""Checking the arguments of a collective and allocating its outputs (CuPy arrays or PyTorch
tensors, zero-copy)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from fusionc.comm.kernel import ITEMSIZE
from fusionc.errors import InputError

_TORCH = {"torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32"}
_CUPY = {"float16": "f16", "float32": "f32", "uint16": "bf16"}


@dataclass
class Prepared:
    """Checked arguments: pointers, sizes, the stream, outputs (objects and pointers)."""

    tokens: int
    hidden: int
    dtype: str
    x_ptr: int
    residual: int | None
    weight: int | None
    y: object
    h: object
    y_ptr: int
    h_ptr: int
    stream: object
    x_obj: object = None
    eps: float = 1e-5
    nccl_sum: object = None  # the NCCL fallback's reduced copy of x (CuPy)

    def results(self):
        return self.h if self.y is None else (self.y, self.h)


def _info(a, what: str, dtype: str | None):
    """(dtype, shape, pointer, is_torch) of array ``a``; InputError when unusable."""
    import cupy
    if type(a).__module__.startswith("torch"):
        dt = _TORCH.get(str(a.dtype))
        if dt is None or not a.is_cuda or a.device.index != cupy.cuda.Device().id:
            raise InputError(f"{what} is a {a.dtype} tensor on {a.device}", op="all_reduce",
                             valid=f"float16, bfloat16 or float32 on cuda:"
                                   f"{cupy.cuda.Device().id}")
        ok, ptr, shape = a.is_contiguous(), a.data_ptr(), tuple(a.shape)
        torch = True
    elif isinstance(a, cupy.ndarray):
        dt = _CUPY.get(str(a.dtype))
        if dt == "bf16" and dtype != "bf16" or dt is None or a.device.id != cupy.cuda.Device().id:
            raise InputError(f"{what} is a CuPy {a.dtype} array on GPU {a.device.id}",
                             op="all_reduce", valid="float16, float32, or uint16 bits with "
                             f"dtype='bf16', on GPU {cupy.cuda.Device().id}")
        ok, ptr, shape, torch = a.flags.c_contiguous, a.data.ptr, tuple(a.shape), False
        if dtype not in (None, dt):
            raise InputError(f"{what} is a CuPy {a.dtype} array but dtype={dtype!r}",
                             op="all_reduce", valid=f"dtype=None or {dt!r}")
    else:
        raise InputError(f"{what} is a {type(a).__name__}", op="all_reduce",
                         valid="a CuPy array or a PyTorch CUDA tensor")
    if not ok or ptr % 16:
        raise InputError(f"{what} is not contiguous or not 16-byte aligned", op="all_reduce",
                         valid="a contiguous, 16-byte aligned buffer")
    return dt, shape, ptr, torch


def as_stream(stream):
    """A CuPy stream for ``stream`` (a CuPy stream, a PyTorch stream, or None)."""
    if stream is None or hasattr(stream, "ptr"):
        return stream
    if hasattr(stream, "cuda_stream"):
        import cupy
        return cupy.cuda.ExternalStream(stream.cuda_stream)
    raise InputError(f"stream is a {type(stream).__name__}", op="all_reduce",
                     valid="a CuPy or PyTorch CUDA stream, or None")


def prepare(x, residual, weight, out_y, out_h, dtype: str | None, max_bytes: int,
            eps: float) -> Prepared:
    """Check the arguments of ``Communicator.all_reduce`` and allocate missing outputs.

    Raises:
        InputError: naming the argument and what is valid.
    """
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
        raise InputError(f"eps = {eps!r}", op="all_reduce", valid="a finite eps >= 0")
    if out_y is not None and weight is None:
        raise InputError("out_y without weight", op="all_reduce",
                         valid="out_y only with the RMSNorm weight (y exists only then)")
    dt, shape, xp, torch = _info(x, "x", dtype)
    if len(shape) < 1 or shape[-1] < 1:
        raise InputError(f"x has shape {list(shape)}", op="all_reduce", valid="[..., D], D >= 1")
    hidden = shape[-1]
    tokens = 1
    for n in shape[:-1]:
        tokens *= n
    if tokens * hidden * ITEMSIZE[dt] > max_bytes:
        raise InputError(f"payload of {tokens * hidden * ITEMSIZE[dt]} bytes", op="all_reduce",
                         valid=f"at most max_bytes = {max_bytes} (build the Communicator with "
                               "a larger max_bytes)")
    if weight is not None and residual is None:
        raise InputError("weight without residual", op="all_reduce",
                         valid="all_reduce(x), (x, residual) or (x, residual, weight)")
    ptrs = {}
    for name, a, want in (("residual", residual, shape), ("weight", weight, (hidden,))):
        if a is None:
            ptrs[name] = None
            continue
        adt, ashape, ptrs[name], _ = _info(a, name, dt)
        if adt != dt or ashape != want:
            raise InputError(f"{name} is {adt}{list(ashape)}", op="all_reduce",
                             valid=f"{dt}{list(want)} like x")
    y, yp = _output(out_y, x, shape, dt, torch, "out_y") if weight is not None else (None, 0)
    h, hp = _output(out_h, x, shape, dt, torch, "out_h")
    from fusionc.runtime.arrays import current_stream
    return Prepared(tokens, hidden, dt, xp, ptrs["residual"], ptrs["weight"], y, h, yp, hp,
                    current_stream(torch), x_obj=x, eps=float(eps))


def _output(given, x, shape, dt, torch: bool, what: str):
    if given is None:
        if torch:
            import torch as t
            out = t.empty_like(x)
            return out, out.data_ptr()
        import cupy
        out = cupy.empty_like(x)
        return out, out.data.ptr
    gdt, gshape, ptr, _ = _info(given, what, dt)
    if gdt != dt or gshape != shape:
        raise InputError(f"{what} is {gdt}{list(gshape)}", op="all_reduce",
                         valid=f"{dt}{list(shape)} like x")
    return given, ptr
