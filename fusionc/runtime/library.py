"""Library calls on the GPU: cuBLAS GEMMs and CuPy elementwise kernels for the graph ops that
run outside fusionc's own kernels (prefill-sized tensors, the decode step's head). fp32
arithmetic, one rounding to the storage dtype per op — the interpreter's rules.

Storage dtypes as in :mod:`fusionc.runtime.arrays`: f16 arrays are float16, bf16 arrays uint16
bit patterns, f32 arrays float32. Every call runs on the current CuPy stream.
"""
from __future__ import annotations

import functools

import numpy as np

# 16-bit storage <-> fp32 in the CuPy kernels, per storage dtype
PREAMBLE = {
    "f16": r"""
__device__ __forceinline__ float fc_f32(float16 x) { return float(x); }
__device__ __forceinline__ void fc_store(float v, float16 &o) { o = float16(v); }
""",
    "bf16": r"""
__device__ __forceinline__ float fc_f32(unsigned short x) {   // bf16 bits
  return __uint_as_float(((unsigned int)x) << 16); }
__device__ __forceinline__ void fc_store(float v, unsigned short &o) {   // round to nearest even
  unsigned int u = __float_as_uint(v);
  o = (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16); }
""",
    "f32": r"""
__device__ __forceinline__ float fc_f32(float x) { return x; }
__device__ __forceinline__ void fc_store(float v, float &o) { o = v; }
""",
}
CUDA_R = {"f16": 2, "bf16": 14, "f32": 0}  # cudaDataType: CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F
_GEMM_DEFAULT = -1  # cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT
_ONE_ZERO = np.array([1.0, 0.0], np.float32)  # alpha, beta (host pointer mode)
_ONE_ONE = np.array([1.0, 1.0], np.float32)    # alpha, beta: out = x · wᵀ + out (the bias)


@functools.cache
def norm_kernels(dtype: str):
    """(sum of squares per row, scale and round) CuPy kernels of RMSNorm (Zhang & Sennrich
    2019, eq. 4): ``y = w · (x · rsqrt(mean(x²) + eps))``."""
    import cupy
    sumsq = cupy.ReductionKernel("T x", "float32 y", "fc_f32(x) * fc_f32(x)", "a + b", "y = a",
                                 "0", "fc_sumsq", preamble=PREAMBLE[dtype])
    scale = cupy.ElementwiseKernel(
        "T x, T w, float32 ss, float32 n, float32 eps", "T y",
        "fc_store(fc_f32(w) * (fc_f32(x) * rsqrtf(ss / n + eps)), y)", "fc_rms_scale",
        preamble=PREAMBLE[dtype])
    return sumsq, scale


@functools.cache
def _binary(dtype: str, name: str, expr: str):
    import cupy
    return cupy.ElementwiseKernel("T a, T b", "T y", f"float u = fc_f32(a), v = fc_f32(b); "
                                  f"fc_store({expr}, y)", f"fc_{name}", preamble=PREAMBLE[dtype])


def rms_norm(x, w, eps: float, out, dtype: str, ss=None):
    """``out = rms_norm(x) · w`` over the last axis (x ``[T, D]``, w ``[D]``); ``ss``: the
    fp32 ``[T, 1]`` buffer of the sums of squares (default: allocated here, which a CUDA graph
    capture refuses; give one from a capture-aware allocator). Returns ``ss`` (keep it alive
    while a captured graph uses it)."""
    import cupy
    sumsq, scale = norm_kernels(dtype)
    if ss is None:
        ss = cupy.empty((x.shape[0], 1), cupy.float32)
    if x.shape[0]:
        sumsq(x, axis=1, keepdims=True, out=ss)
    scale(x, w[None, :], ss, np.float32(x.shape[1]), np.float32(eps), out)
    return ss


def silu_mul(gate, up, out, dtype: str) -> None:
    """``out = silu(gate) · up`` (Shazeer 2020, SwiGLU), fp32 math, one rounding."""
    _binary(dtype, "silu_mul", "u / (1.0f + expf(-u)) * v")(gate, up, out)


def add(a, b, out, dtype: str) -> None:
    """``out = a + b`` rounded once."""
    _binary(dtype, "add", "u + v")(a, b, out)


def mul(a, b, out, dtype: str) -> None:
    """``out = a · b`` rounded once."""
    _binary(dtype, "mul", "u * v")(a, b, out)


@functools.cache
def _unary(src: str, dst: str, name: str, expr: str):
    import cupy
    pre = PREAMBLE[src] + (PREAMBLE[dst] if dst != src else "")
    return cupy.ElementwiseKernel("T a", "Y y", f"float u = fc_f32(a); fc_store({expr}, y)",
                                  f"fc_{name}_{src}_{dst}", preamble=pre)


def silu(x, out, dtype: str) -> None:
    """``out = x · sigmoid(x)`` (SiLU, Hendrycks & Gimpel 2016), fp32 math, one rounding."""
    _unary(dtype, dtype, "silu", "u / (1.0f + expf(-u))")(x, out)


def cast(x, out, src: str, dst: str) -> None:
    """``out = x`` converted from dtype ``src`` to ``dst`` (through fp32: exact for every
    16-bit value; round to nearest even into a 16-bit ``dst``)."""
    _unary(src, dst, "cast", "u")(x, out)


@functools.cache
def _gather():
    import cupy
    return cupy.ElementwiseKernel(
        "raw T table, raw int32 tokens, int32 vocab, int32 hidden", "T y",
        "int b = i / hidden, t = tokens[b];"
        "y = (t >= 0 && t < vocab) ? table[(long long)t * hidden + (i - b * hidden)] : T(0.0f)",
        "fc_embedding")


def embedding(table, tokens, out) -> None:
    """``out[b] = table[tokens[b]]`` (``table [vocab, hidden]`` contiguous, ``tokens i32[B]``,
    ``out [B, hidden]`` of the table's dtype: a copy, no rounding). A token outside
    ``[0, vocab)`` gets a row of zeros rather than a read outside the table (ids are device
    values here; the interpreter raises InputError, and ``fusionc.models.Decoder`` checks them
    on the host)."""
    for name, m in (("table", table), ("tokens", tokens)):
        if not m.flags.c_contiguous:
            from fusionc.errors import InputError
            raise InputError(f"{name} has strides {m.strides}", op="embedding",
                             valid="a contiguous array")
    if out.size:
        _gather()(table, tokens, np.int32(table.shape[0]), np.int32(table.shape[1]), out)


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


def gemm_plan(T: int, K: int, N: int, dtype: str, device: int, out_dtype: str | None = None):
    """:func:`gemm` of contiguous ``x [T, K]``, ``w [N, K]`` and ``out [T, N]`` (of
    ``out_dtype``, default ``dtype``) fixed once:
    returns ``run(stream, x_ptr, w_ptr, out_ptr)`` for a stream handle and device pointers
    (the cached call path of :mod:`fusionc.runtime.plan`; nothing is checked per call)."""
    if T == 0:
        return lambda stream, x, w, out: None
    handles, lib = _HANDLES, _cublas()
    t, to, a = CUDA_R[dtype], CUDA_R[out_dtype or dtype], _ONE_ZERO.ctypes.data
    call = lib.cublasGemmEx

    def run(stream, x, w, out):
        h = handles.get((device, stream))
        if h is None:
            h = handle_for(device, stream)
        _check(call(h, 1, 0, N, T, K, a, w, t, K, x, t, K, a + 4, out, to, N, 68,
                    _GEMM_DEFAULT), "cublasGemmEx")
    return run
