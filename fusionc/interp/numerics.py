"""Numerics shared by the interpreter and the simulator: rounding to storage dtypes.

numpy has no bfloat16; bf16 values are held in float32 arrays whose low 16 bits are zero, rounded
to nearest even as the GPU's ``__float2bfloat16_rn`` does (NaN stays NaN).
"""
from __future__ import annotations

import numpy as np

from fusionc.ir.types import DType


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Round float values to bfloat16 (nearest even), returned as float32."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = rounded.view(np.float32)
    return np.where(np.isnan(f), np.float32(np.nan), out)


def round_to(x: np.ndarray, dtype: DType) -> np.ndarray:
    """``x`` rounded to ``dtype`` and held in ``dtype.numpy`` (bf16 in float32).

    f16 overflow gives ±inf, as on the GPU.
    """
    if dtype == DType.bf16:
        return round_bf16(x)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x).astype(dtype.numpy)


def accumulate_dtype(dtype: DType, precise: bool = False) -> np.dtype:
    """The numpy dtype used for arithmetic: float32 (as fp32 accumulation on the GPU), or
    float64 when ``precise`` (the float64 reference)."""
    return np.dtype(np.float64 if precise else np.float32)


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """Norm-wise relative error ‖out − ref‖ / ‖ref‖ (Frobenius norms, in float64).

    0 when both are zero; inf when only ``ref`` is zero.
    """
    o, r = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    num, den = float(np.linalg.norm(o - r)), float(np.linalg.norm(r))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def defined_relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """:func:`relative_error` over the entries where ``ref`` is not NaN (KV-cache tails hold NaN
    on purpose). NaN in ``out`` where ``ref`` is defined, or nothing defined at all, is inf."""
    o, r = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    keep = ~np.isnan(r)
    if not keep.any() or np.isnan(o[keep]).any():
        return float("inf")
    return relative_error(o[keep], r[keep])
