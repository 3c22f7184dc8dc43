"""Library kernels of a prompt processed in chunks (issue 25, ``fusionc/models/prefill.py``) on
the GPU: RoPE, the KV-cache write and causal attention over each sequence's cache, as CuPy
kernels and cuBLAS GEMMs (``cupy.matmul``), fp32 arithmetic, one rounding per op: the
interpreter's rules (``fusionc/ir/ops/rope.py``, ``fusionc/ir/ops/chunk.py``).

These run outside CUDA graphs (a prompt's chunks are not captured): :func:`chunk_attention`
needs ``seq_of`` and ``positions`` on the host to cut the rows into sequences (a caller that has
them passes them through :func:`host_mirrors`, else they are copied back), and allocates its
fp32 scores. Storage dtypes as in :mod:`fusionc.runtime.library` (bf16 as uint16 bits).
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np

from fusionc.runtime.library import cast


# 16-bit storage (and fp32) <-> fp32 without headers: the kernels below compile with NVRTC as
# they are (tests/runtime/test_library_attention.py compiles them on a machine without a GPU)
_CONVERT = {
    "f16": ("unsigned short", r"""
__device__ __forceinline__ float fc_f32(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short fc_bits(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
"""),
    "bf16": ("unsigned short", r"""
__device__ __forceinline__ float fc_f32(unsigned short x) {
  return __uint_as_float(((unsigned int)x) << 16); }
__device__ __forceinline__ unsigned short fc_bits(float v) {   // round to nearest even
  unsigned int u = __float_as_uint(v);
  return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16); }
"""),
    "f32": ("float", r"""
__device__ __forceinline__ float fc_f32(float x) { return x; }
__device__ __forceinline__ float fc_bits(float v) { return v; }
"""),
}


def rope_source(dtype: str, style: str) -> str:
    """CUDA source of ``fc_rope``: ``y[t, h, :] = x[t, h, :]`` rotated by ``pos[t] · inv[j]``
    (RoFormer, Su et al. 2021, eq. 34) on the pairs of ``style`` (neox: (j, j + r/2); gptj:
    (2j, 2j + 1)) of the first ``r`` features, fp32 math, one rounding; the rest copied. One
    thread per (row, head, pair)."""
    ty, conv = _CONVERT[dtype]
    a, b = ("j", "j + r / 2") if style == "neox" else ("2 * j", "2 * j + 1")
    return conv + f"""
extern "C" __global__ void fc_rope(const {ty}* x, const int* pos, const float* inv, {ty}* y,
                                   int n, int heads, int d, int r) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int half = r / 2, t = i / (heads * half), rest = i % (heads * half);
  int h = rest / half, j = rest % half;
  long long base = ((long long)t * heads + h) * d;
  int a = {a}, b = {b};
  float ang = (float)pos[t] * inv[j], c = cosf(ang), s = sinf(ang);
  float x1 = fc_f32(x[base + a]), x2 = fc_f32(x[base + b]);
  y[base + a] = fc_bits(x1 * c - x2 * s);
  y[base + b] = fc_bits(x2 * c + x1 * s);
  if (j == 0)
    for (int k = r; k < d; ++k) y[base + k] = x[base + k];
}}
"""


def write_source(dtype: str) -> str:
    """CUDA source of ``fc_kv_cache_write``: ``cache[seq_of[t], pos[t], :] = src[t, :]`` for
    rows of ``width`` elements; rows outside the cache skipped. One thread per element."""
    ty, _ = _CONVERT[dtype]
    return f"""
extern "C" __global__ void fc_kv_cache_write(const {ty}* src, const int* seq_of, const int* pos,
                                             {ty}* cache, long long n, int seqs, int s_max,
                                             int width) {{
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int t = (int)(i / width), e = (int)(i % width), s = seq_of[t], p = pos[t];
  if (s >= 0 && s < seqs && p >= 0 && p < s_max)
    cache[((long long)s * s_max + p) * width + e] = src[i];
}}
"""


@functools.cache
def _kernel(source: str, name: str):
    import cupy
    return cupy.RawKernel(source, name)


def _launch(kernel, n: int, args) -> None:
    threads = 256
    kernel(((n + threads - 1) // threads,), (threads,), args)


def rope(x, positions, out, *, theta: float, style: str, rotary_dim: int, scaling, dtype: str):
    """``out = rope(x)`` for ``x [T, heads, head_dim]`` at ``positions i32[T]``; the
    frequencies from :func:`fusionc.ir.ops.rope.inv_freq` (Llama 3.1 scaling included),
    rounded to fp32 like the interpreter's. ``out`` contiguous."""
    import cupy
    t, heads, d = x.shape
    n = t * heads * (rotary_dim // 2)
    if not n:
        return
    x = cupy.ascontiguousarray(x)
    inv = _inv_freq(theta, rotary_dim, tuple(scaling), cupy.cuda.Device().id)
    _launch(_kernel(rope_source(dtype, style), "fc_rope"), n,
            (x, cupy.ascontiguousarray(positions), inv, out, np.int32(n), np.int32(heads),
             np.int32(d), np.int32(rotary_dim)))


@functools.lru_cache(maxsize=64)
def _inv_freq(theta: float, rotary_dim: int, scaling: tuple, device: int):
    """The fp32 frequencies on ``device``, uploaded once per (theta, rotary_dim, scaling)
    rather than on every call (every layer of every chunk)."""
    import cupy
    from fusionc.ir.ops.rope import inv_freq
    return cupy.asarray(inv_freq(theta, rotary_dim, scaling).astype(np.float32))


def kv_cache_write(k_cache, v_cache, k, v, seq_of, positions, dtype: str) -> None:
    """``cache[seq_of[t], positions[t]] = k[t]`` (and v) in place (caches ``[N, S, KV, D]``
    contiguous, ``k``, ``v`` ``[T, KV, D]``); rows whose sequence or position lies outside the
    cache are skipped (the interpreter raises InputError for them)."""
    import cupy
    t = k.shape[0]
    n_seq, s_max, kvh, d = k_cache.shape
    n = t * kvh * d
    if not n:
        return
    kern = _kernel(write_source(dtype), "fc_kv_cache_write")
    for cache, src in ((k_cache, k), (v_cache, v)):
        _launch(kern, n, (cupy.ascontiguousarray(src), cupy.ascontiguousarray(seq_of),
                          cupy.ascontiguousarray(positions), cache, np.int64(n),
                          np.int32(n_seq), np.int32(s_max), np.int32(kvh * d)))


def chunk_attention(q, k_cache, v_cache, seq_of, positions, scale: float, out,
                    dtype: str) -> None:
    """``out[t] = softmax(scale · q[t] · Kᵀ) · V`` over positions ``0..positions[t]`` of
    sequence ``seq_of[t]``'s cache (``fusionc.ir.ops.chunk``): per run of rows of one sequence,
    the query heads of each KV head as one matrix against the run's cache prefix — scores by a
    GEMM (fp32), the causal mask, an fp32 softmax, then P·V — so a run reads its prefix once."""
    import cupy
    t_, h, d = q.shape
    if not t_:
        return
    hkv = k_cache.shape[2]
    g = h // hkv
    seqs, pos = _host(seq_of), _host(positions)
    from types import SimpleNamespace

    from fusionc.ir.ops.chunk import check_rows
    check_rows(SimpleNamespace(name="chunk_attention", loc=None), seqs, pos, k_cache.shape[0],
               k_cache.shape[1])   # the interpreter's InputError, naming the op
    start = 0
    while start < t_:
        end = start + 1
        while end < t_ and seqs[end] == seqs[start]:
            end += 1
        s, n = int(seqs[start]), int(pos[end - 1]) + 1
        if 0 <= s < k_cache.shape[0] and 0 < n <= k_cache.shape[1]:
            kk = _f32(k_cache[s, :n], dtype).transpose(1, 0, 2)   # [KV, n, D]
            vv = _f32(v_cache[s, :n], dtype).transpose(1, 0, 2)
            qq = _f32(q[start:end], dtype).reshape(end - start, hkv, g, d)
            qq = qq.transpose(1, 0, 2, 3).reshape(hkv, (end - start) * g, d)
            sc = cupy.matmul(qq, kk.transpose(0, 2, 1)) * np.float32(scale)  # [KV, rows·G, n]
            lim = cupy.asarray(pos[start:end].astype(np.int64) + 1).repeat(g)   # keys per row
            sc = cupy.where(cupy.arange(n)[None, None, :] < lim[None, :, None], sc,
                            np.float32(-np.inf))
            sc = cupy.exp(sc - sc.max(axis=-1, keepdims=True))
            o = cupy.matmul(sc, vv) / sc.sum(axis=-1, keepdims=True)   # [KV, rows·G, D]
            o = o.reshape(hkv, end - start, g, d).transpose(1, 0, 2, 3).reshape(-1, h, d)
            cast(cupy.ascontiguousarray(o), out[start:end], "f32", dtype)
        else:   # a sequence outside the cache (the interpreter raises InputError)
            out[start:end] = 0
        start = end


_MIRRORS: dict = {}   # (device pointer, size) -> the host copy a caller vouches for


@contextlib.contextmanager
def host_mirrors(*pairs):
    """Within the block, :func:`chunk_attention` reads the host copy of each ``(device array,
    numpy array)`` pair instead of copying the device array back (a device-to-host copy waits
    for the stream: every layer of a chunk would stall). The caller keeps both alive and
    unchanged inside the block."""
    keys = [(d.data.ptr, d.size) for d, _ in pairs]
    _MIRRORS.update({k: np.asarray(h) for k, (_, h) in zip(keys, pairs)})
    try:
        yield
    finally:
        for k in keys:
            _MIRRORS.pop(k, None)


def _host(x) -> np.ndarray:
    """``x`` on the host: its mirror from :func:`host_mirrors`, else a copy back."""
    m = _MIRRORS.get((x.data.ptr, x.size))
    return m if m is not None else x.get()


def _f32(x, dtype: str):
    """A contiguous fp32 copy of ``x`` (storage ``dtype``)."""
    import cupy
    out = cupy.empty(x.shape, cupy.float32)
    cast(cupy.ascontiguousarray(x), out, dtype, "f32")
    return out
