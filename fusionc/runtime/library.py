"""Library calls on the GPU: cuBLAS GEMMs and row kernels
(:mod:`fusionc.runtime.row_kernels`) for the graph ops that run outside fusionc's own kernels (prefill-sized tensors, the decode step's head). fp32
arithmetic, one rounding to the storage dtype per op — the interpreter's rules.

Storage dtypes as in :mod:`fusionc.runtime.arrays`: f16 arrays are float16, bf16 arrays uint16
bit patterns, f32 arrays float32. Every call runs on the current CuPy stream.
"""
from __future__ import annotations

import functools

import numpy as np

CUDA_R = {"f16": 2, "bf16": 14, "f32": 0}  # cudaDataType: CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F
_GEMM_DEFAULT = -1  # cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT
_ONE_ZERO = np.array([1.0, 0.0], np.float32)  # alpha, beta (host pointer mode)
_ONE_ONE = np.array([1.0, 1.0], np.float32)    # alpha, beta: out = x · wᵀ + out (the bias)


def _on_stream() -> tuple:
    """(the current CuPy stream's handle, the current device): where a row kernel launches."""
    import cupy
    return cupy.cuda.get_current_stream().ptr, cupy.cuda.Device().id


def _rows(x) -> tuple:
    """``(x as [rows, cols], its row stride in elements, whether that is a copy)``: a view
    where the elements of each row are contiguous (a split's halves, a broadcast row), else a
    contiguous copy (the general path only: a planned call's buffers are contiguous)."""
    import cupy
    copied = False
    if x.ndim < 2:
        x = x.reshape(1, -1)
    elif x.ndim > 2:
        if not x.flags.c_contiguous:
            x, copied = cupy.ascontiguousarray(x), True
        x = x.reshape(-1, x.shape[-1])
    if x.shape[1] > 1 and x.strides[1] != x.itemsize or x.strides[0] % x.itemsize:
        x, copied = cupy.ascontiguousarray(x), True
    return x, (x.strides[0] // x.itemsize if x.shape[0] > 1 else x.shape[1]), copied


def _row_op(ins: list, out, launch_of, op: str) -> None:
    """Run row kernel ``launch_of(device, cols, row strides)`` of graph op ``op`` over ``ins``
    into ``out``, all seen as ``[rows, cols]`` (:func:`_rows`; into a temporary copied to
    ``out`` where its rows are not contiguous). DeviceError where a copy would be made while
    the stream is being captured (the graph would replay into memory freed after the call)."""
    if not out.size:
        return
    stream, device = _on_stream()
    views = [_rows(x) for x in ins]
    dst, ld, copied = _rows(out)
    if (copied or any(c for _, _, c in views)) and _capturing(stream):
        from fusionc.errors import DeviceError
        raise DeviceError("an operand whose rows are not contiguous would need a copy during "
                          "a CUDA-graph capture", op=op,
                          valid="operands with contiguous rows (a split's halves are fine)")
    launch_of(device, dst.shape[1], tuple(s for _, s, _ in views) + (ld,))(
        [x.data.ptr for x, _, _ in views] + [dst.data.ptr], stream)
    if copied:
        out[...] = dst.reshape(out.shape)


def _capturing(stream: int) -> bool:
    import cupy
    return bool(cupy.cuda.runtime.streamIsCapturing(stream))


def rms_norm(x, w, eps: float, out, dtype: str) -> None:
    """``out = rms_norm(x) · w`` over the last axis (x ``[T, D]``, w ``[D]``; Zhang & Sennrich
    2019, eq. 4), fp32 sums, one rounding: one CTA a row (:mod:`fusionc.runtime.row_kernels`)."""
    from fusionc.runtime import row_kernels
    T, D = x.shape
    _row_op([x, w[None, :]], out,
            lambda dev, cols, lds: row_kernels.rms_norm(dtype, T, D, float(eps), lds, dev),
            "rms_norm")


def _binary(name: str, a, b, out, dtype: str) -> None:
    from fusionc.runtime import row_kernels
    _row_op([a, b], out, lambda dev, cols, lds: row_kernels.binary(name, dtype, out.size, cols,
                                                                   lds, dev), name)


def silu_mul(gate, up, out, dtype: str) -> None:
    """``out = silu(gate) · up`` (Shazeer 2020, SwiGLU), fp32 math, one rounding."""
    _binary("silu_mul", gate, up, out, dtype)


def add(a, b, out, dtype: str) -> None:
    """``out = a + b`` rounded once."""
    _binary("add", a, b, out, dtype)


def mul(a, b, out, dtype: str) -> None:
    """``out = a · b`` rounded once."""
    _binary("mul", a, b, out, dtype)


def silu(x, out, dtype: str) -> None:
    """``out = x · sigmoid(x)`` (SiLU, Hendrycks & Gimpel 2016), fp32 math, one rounding."""
    from fusionc.runtime import row_kernels
    _row_op([x], out, lambda dev, cols, lds: row_kernels.unary("silu", dtype, dtype, out.size,
                                                               cols, lds, dev), "silu")


def cast(x, out, src: str, dst: str) -> None:
    """``out = x`` converted from dtype ``src`` to ``dst`` (through fp32: exact for every
    16-bit value; round to nearest even into a 16-bit ``dst``; a copy when they are equal).
    ``x`` may be broadcast (a bias row over the batch: a row stride of 0)."""
    import cupy
    from fusionc.runtime import row_kernels
    if x.shape != out.shape:
        x = cupy.broadcast_to(x, out.shape)
    _row_op([x], out, lambda dev, cols, lds: row_kernels.unary("cast", src, dst, out.size,
                                                               cols, lds, dev), "cast")


def embedding(table, tokens, out) -> None:
    """``out[b] = table[tokens[b]]`` (``table [vocab, hidden]`` contiguous, ``tokens i32[B]``,
    ``out [B, hidden]`` of the table's dtype: a copy, no rounding). A token outside
    ``[0, vocab)`` gets a row of zeros rather than a read outside the table (ids are device
    values here; the interpreter raises InputError, and ``fusionc.models.Decoder`` checks them
    on the host)."""
    from fusionc.runtime import row_kernels
    for name, m in (("table", table), ("tokens", tokens), ("out", out)):
        if not m.flags.c_contiguous:
            from fusionc.errors import InputError
            raise InputError(f"{name} has strides {m.strides}", op="embedding",
                             valid="a contiguous array")
    vocab, hidden = table.shape
    stream, device = _on_stream()
    row_kernels.embedding(_dtype_of()[table.dtype.name], tokens.size, vocab, hidden, device)(
        [table.data.ptr, tokens.data.ptr, out.data.ptr], stream)


@functools.cache
def _dtype_of() -> dict:
    """Storage dtype name -> fusionc float dtype (bf16 as uint16 bits: arrays._CUPY)."""
    from fusionc.ir.types import DType
    from fusionc.runtime.arrays import _CUPY
    return {_CUPY[d]: d.value for d in (DType.f16, DType.bf16, DType.f32)}


_HANDLES: dict = {}


@functools.cache
def _cublas():
    """libcublas through ctypes (located by cuda-pathfinder). CuPy's cuBLAS wrappers re-bind
    the handle's stream on every call, which CUDA-graph capture forbids; the library itself
    is capturable."""
    import ctypes

    from cuda.pathfinder import load_nvidia_dynamic_lib
    lib = ctypes.CDLL(load_nvidia_dynamic_lib("cublas").abs_path)
    P, I = ctypes.c_void_p, ctypes.c_int
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(P)]
    lib.cublasSetStream_v2.argtypes = [P, P]
    lib.cublasGemmEx.argtypes = [P, I, I, I, I, I, P, P, I, I, P, I, I, P, P, I, I, I, I]
    L = ctypes.c_longlong
    lib.cublasGemmStridedBatchedEx.argtypes = [P, I, I, I, I, I, P, P, I, I, L, P, I, I, L,
                                               P, P, I, I, L, I, I, I]
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        from fusionc.errors import DeviceError
        raise DeviceError(f"{what} failed: cuBLAS status {status}")


def _handle(stream):
    """A cuBLAS handle bound once to ``stream`` (created on the stream's first call, which
    must not be captured: the warm-up before a capture)."""
    import cupy
    return handle_for(cupy.cuda.Device().id, stream.ptr)


def handle_for(device: int, stream: int):
    """:func:`_handle` of stream handle ``stream`` on ``device`` (the current device)."""
    import ctypes

    from fusionc.errors import DeviceError
    key = (device, stream)
    h = _HANDLES.get(key)
    if h is None:
        import cupy
        if cupy.cuda.runtime.streamIsCapturing(stream):
            raise DeviceError("the first cuBLAS call on a stream is being captured",
                              op="library_call", valid="call the graph once on that stream "
                              "before capturing it (the warm-up creates its cuBLAS handle)")
        h = ctypes.c_void_p()
        _check(_cublas().cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
        _check(_cublas().cublasSetStream_v2(h, stream), "cublasSetStream")
        _HANDLES[key] = h
    return h


def gemm(x, w, out, dtype: str, bias=None, out_dtype: str | None = None) -> None:
    """``out [T, N] = x [T, K] · w [N, K]ᵀ (+ bias [N])`` with cublasGemmEx: inputs of
    ``dtype`` (16-bit or fp32), ``out`` of ``out_dtype`` (default ``dtype``; fp32 from 16-bit
    inputs: the LM head's logits), fp32 compute (CUBLAS_COMPUTE_32F), on the current stream;
    capturable in a CUDA graph once the stream has run one call. ``x`` may be a row-strided
    view (rows contiguous). The bias is broadcast into ``out`` first (converted to
    ``out_dtype``, exactly) and added by the GEMM (beta = 1): fp32 sums, one rounding, as the
    interpreter's ``linear``."""
    import cupy
    T, K = x.shape
    N = w.shape[0]
    if T == 0:
        return
    for name, m in (("x", x), ("w", w), ("out", out)):
        if m.strides[1] != m.itemsize or m.strides[0] % m.itemsize:
            from fusionc.errors import InputError
            raise InputError(f"{name} has strides {m.strides}", op="library_call",
                             valid="rows of contiguous elements")
    handle = _handle(cupy.cuda.get_current_stream())
    od = out_dtype or dtype
    t, a = CUDA_R[dtype], (_ONE_ZERO if bias is None else _ONE_ONE).ctypes.data
    if bias is not None and od == dtype:
        out[...] = bias[None, :]
    elif bias is not None:
        cast(bias[None, :], out, dtype, od)
    ld = [m.strides[0] // m.itemsize for m in (w, x, out)]
    # column-major: out^T [N, T] = w [N, K] · x^T [K, T]; CUBLAS_OP_T = 1, CUBLAS_OP_N = 0,
    # CUBLAS_COMPUTE_32F = 68 (host pointer mode, the default, for alpha and beta)
    _check(_cublas().cublasGemmEx(handle, 1, 0, N, T, K, a, w.data.ptr, t, ld[0], x.data.ptr,
                                  t, ld[1], a + 4, out.data.ptr, CUDA_R[od], ld[2], 68,
                                  _GEMM_DEFAULT),
           "cublasGemmEx")


def head_gemm(x, w, out, dtype: str) -> None:
    """``out[b, h, n] = Σ_k x[b, h, k] · w[h, n, k]`` (``head_linear``: MLA's absorbed W_UK
    and W_UV, DeepSeek-V2 appendix C) as one cublasGemmStridedBatchedEx over the heads, fp32
    compute, one rounding; ``x [B, H, K]`` may be a strided view (a split of the query heads)
    whose last axis is contiguous, ``w [H, N, K]`` and ``out [B, H, N]`` contiguous."""
    import cupy
    B, H, K = x.shape
    N = w.shape[1]
    if B == 0 or H == 0:
        return
    if x.strides[2] != x.itemsize or x.strides[0] % x.itemsize or x.strides[1] % x.itemsize \
            or not w.flags.c_contiguous or not out.flags.c_contiguous:
        from fusionc.errors import InputError
        raise InputError(f"x has strides {x.strides}", op="head_linear",
                         valid="heads of contiguous elements; w and out contiguous")
    handle = _handle(cupy.cuda.get_current_stream())
    t, a = CUDA_R[dtype], _ONE_ZERO.ctypes.data
    sb, sh = x.strides[0] // x.itemsize, x.strides[1] // x.itemsize
    # column-major per head h: out_h^T [N, B] (ld H·N) = w_h [N, K] · x_h^T [K, B] (ld sb)
    _check(_cublas().cublasGemmStridedBatchedEx(
        handle, 1, 0, N, B, K, a, w.data.ptr, t, K, N * K, x.data.ptr, t, sb, sh, a + 4,
        out.data.ptr, t, H * N, N, H, 68, _GEMM_DEFAULT), "cublasGemmStridedBatchedEx")


def gemm_plan(T: int, K: int, N: int, dtype: str, device: int, out_dtype: str | None = None,
              ldx: int | None = None):
    """:func:`gemm` of ``x [T, K]`` (rows ``ldx`` elements apart, default K), contiguous
    ``w [N, K]`` and ``out [T, N]`` (of ``out_dtype``, default ``dtype``) fixed once:
    returns ``run(stream, x_ptr, w_ptr, out_ptr)`` for a stream handle and device pointers
    (the cached call path of :mod:`fusionc.runtime.plan`; nothing is checked per call)."""
    if T == 0:
        return lambda stream, x, w, out: None
    handles, lib = _HANDLES, _cublas()
    t, to, a = CUDA_R[dtype], CUDA_R[out_dtype or dtype], _ONE_ZERO.ctypes.data
    call, lx = lib.cublasGemmEx, ldx or K

    def run(stream, x, w, out):
        h = handles.get((device, stream))
        if h is None:
            h = handle_for(device, stream)
        _check(call(h, 1, 0, N, T, K, a, w, t, K, x, t, lx, a + 4, out, to, N, 68,
                    _GEMM_DEFAULT), "cublasGemmEx")
    return run
