"""Tensor maps of TMA copies (``CUtensorMap``), built by the driver at bind time.

A streamed kernel's ``tensormap`` parameter (``fusionc.codegen.source.KernelParam``) names a
2D tensor ``[rows, cols]`` (row-major) and a box of ``(inner elements, rows)``; the kernel copies
boxes in the 128-byte swizzle (``fusionc.stream.ring``), and elements outside the tensor arrive as
zeros. The map encodes the tensor's address, so it is built per pointer and cached: a decode
loop or a CUDA graph that reuses its buffers builds each map once (:class:`TensorMaps`).
"""
from __future__ import annotations

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
                         valid="16-byte aligned tensors whose rows are a multiple of 16 bytes")
    return check(cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, _DTYPES[dtype]), 2, ptr,
        [cols, max(1, rows)], [cols * item], [box[0], box[1]], [1, 1],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        "cuTensorMapEncodeTiled")


class TensorMaps:
    """Tensor maps by (parameter, pointer, rows): built on first use, then reused."""

    def __init__(self, limit: int = 256):
        self._maps: dict = {}
        self.limit = limit

    def get(self, param, ptr: int, rows: int, box: tuple[int, int]):
        """The map of kernel parameter ``param`` (a KernelParam of kind ``tensormap``) for the
        tensor at ``ptr`` with ``rows`` rows."""
        key = (param.name, ptr, rows)
        m = self._maps.get(key)
        if m is None:
            if len(self._maps) >= self.limit:   # many buffers: forget the oldest
                self._maps.pop(next(iter(self._maps)))
            v = param.value
            m = encode(ptr, v.type.dtype, rows, v.type.shape[-1], box)
            self._maps[key] = m
        return m
