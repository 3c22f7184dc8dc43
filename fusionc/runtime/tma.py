"""Tensor maps of TMA copies (``CUtensorMap``), built by the driver at bind time.

A streamed kernel's ``tensormap`` parameter (``fusionc.codegen.source.KernelParam``) names a
tensor, seen as the 2D row-major ``[rows, cols]`` of its first ``lead`` dims and the rest
(:func:`fusionc.stream.ring.matrix_lead`: ``[H, N, K]`` weights as ``[H·N, K]``, ``[B, H, C]``
activations as ``[B, H·C]``), and a box of ``(inner elements, rows)``; the kernel copies
boxes in the 128-byte swizzle (``fusionc.stream.ring``), and elements outside the tensor arrive as
zeros. The map encodes the tensor's address, so it is built per pointer and cached: a decode
loop or a CUDA graph that reuses its buffers builds each map once (:func:`cached`).
"""
from __future__ import annotations

import ctypes
import math

from fusionc.errors import InputError
from fusionc.ir.types import DType

_DTYPES = {DType.f16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
           DType.bf16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
           DType.f32: "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"}


def encode(ptr: int, dtype: DType, rows: int, cols: int, box: tuple[int, int]):
    """A ``CUtensorMap`` of the row-major ``[rows, cols]`` tensor at device address ``ptr``.

    Raises:
        InputError: an address that is not 16-byte aligned or row bytes that are not a multiple
            of 16 (TMA's rules; the compiler sends such weights down the plain-load path).
        DeviceError: the driver refused the map.
    """
    from fusionc.runtime.launch import check, driver
    cu = driver()
    item = dtype.itemsize
    if ptr % 16 or (cols * item) % 16:
        raise InputError(f"a TMA tensor at {ptr:#x} with rows of {cols * item} bytes",
                         op="tensor map", valid="16-byte aligned tensors whose rows are a multiple of 16 bytes")
    return check(cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, _DTYPES[dtype]), 2, ptr,
        [cu.cuuint64_t(cols), cu.cuuint64_t(max(1, rows))], [cu.cuuint64_t(cols * item)],
        [cu.cuuint32_t(box[0]), cu.cuuint32_t(box[1])], [cu.cuuint32_t(1), cu.cuuint32_t(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        "cuTensorMapEncodeTiled")


class _MapStorage(ctypes.Structure):
    """128 bytes, 64-byte aligned (``CUtensorMap``): the kernel argument's storage."""

    _pack_ = 1
    _fields_ = [("bytes", ctypes.c_ubyte * 192)]   # room to place 128 bytes at 64 alignment

    def aligned(self) -> int:
        a = ctypes.addressof(self)
        return a + (-a) % 64


_CACHE: dict = {}
CACHE_LIMIT = 1024   # maps kept (rotating buffers: a few per weight)


def cached(ptr: int, dtype: DType, rows: int, cols: int, box: tuple[int, int]):
    """:func:`encode`, remembered per (pointer, dtype, shape, box)."""
    key = (ptr, dtype, rows, cols, box)
    m = _CACHE.get(key)
    if m is None:
        if len(_CACHE) >= CACHE_LIMIT:
            _CACHE.pop(next(iter(_CACHE)))
        m = _CACHE[key] = encode(ptr, dtype, rows, cols, box)
    return m


def pack_tensormap(p, ctx):
    """The argument packer of kind ``tensormap`` (``fusionc.runtime.params.PACKERS``): a slot
    that follows the tensor's pointer and holds its map's 128 bytes (rebuilt only when the
    pointer changes)."""
    from fusionc.runtime.params import Slot
    v = p.value
    dims = [d if isinstance(d, int) else ctx.dims.get(d) for d in v.type.shape]
    rows, cols = math.prod(dims[:p.lead]), math.prod(dims[p.lead:])   # its 2D row view
    storage = _MapStorage()
    last = [None]

    def update(st, ptr):
        if ptr != last[0]:
            m = cached(ptr, v.type.dtype, rows, cols, p.box)
            ctypes.memmove(st.aligned(), m.getPtr(), 128)
            last[0] = ptr
    return Slot(storage, v.name, update, storage.aligned())
