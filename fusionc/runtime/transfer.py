"""numpy <-> CuPy transfers in the IR's storage dtypes (bf16 travels as uint16 bits)."""
from __future__ import annotations

import numpy as np

from fusionc.interp.numerics import round_to
from fusionc.ir.types import DType

DEVICE_DTYPES = {DType.f16: np.float16, DType.bf16: np.uint16, DType.f32: np.float32,
                 DType.f64: np.float64, DType.i32: np.int32, DType.i64: np.int64}


def host_to_device_bits(x: np.ndarray, dt: DType) -> np.ndarray:
    """``x`` rounded to ``dt`` in the bit layout the GPU stores (bf16: the high 16 bits)."""
    r = round_to(np.asarray(x), dt)
    if dt == DType.bf16:
        return (np.asarray(r, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.ascontiguousarray(r, DEVICE_DTYPES[dt])


def device_bits_to_host(x: np.ndarray, dt: DType) -> np.ndarray:
    """Inverse of :func:`host_to_device_bits` (bf16 comes back as float32)."""
    if dt == DType.bf16:
        return (np.asarray(x, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(x, dt.numpy)


def upload(x: np.ndarray, dt: DType):
    """A CuPy array holding ``x`` rounded to ``dt``."""
    import cupy
    return cupy.asarray(host_to_device_bits(x, dt))


def download(x, dt: DType) -> np.ndarray:
    """A CuPy array of ``dt`` back as numpy (``dt.numpy``)."""
    return device_bits_to_host(x.get(), dt)


def nan_bits(dt: DType):
    """The NaN poison value in device bits."""
    return np.uint16(0x7FC0) if dt == DType.bf16 else DEVICE_DTYPES[dt](np.nan)
