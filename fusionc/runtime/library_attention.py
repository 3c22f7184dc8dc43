"""Library kernels of a prompt processed in chunks (issue 25, ``fusionc/models/prefill.py``) on
the GPU: RoPE, the KV-cache write and causal attention over each sequence's cache, as CUDA
kernels (CuPy's ``RawKernel``), fp32 arithmetic, one rounding per op: the interpreter's rules
(``fusionc/ir/ops/rope.py``, ``fusionc/ir/ops/chunk.py``). The same kernels run a decode
step's RoPE, KV append and attention where the attention units do not take them (the mixed
path's host attention: :func:`decode_attention`, :func:`kv_cache_append`).

:func:`chunk_attention` checks ``seq_of`` and ``positions`` on the host: a caller that has them
passes them through :func:`host_mirrors`, else they are copied back. The decoder passes them,
so its full chunks can run inside a CUDA graph (``fusionc/models/chunk_capture.py``; a copy back
during a capture fails it, and chunks of that length then run eagerly). Storage dtypes as in
:mod:`fusionc.runtime.library` (bf16 as uint16 bits).
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np


class _Convert(dict):
    """``dtype -> (storage C type, conversions fc_f32 / fc_bits)`` for the kernels below: the
    row kernels' one definition (:mod:`fusionc.runtime.row_kernels`, NVRTC without headers)
    under the names these sources use."""

    def __missing__(self, dt):
        from fusionc.runtime.row_kernels import CONVERT, STORAGE
        ty = STORAGE[dt]
        self[dt] = (ty, CONVERT + f"""
__device__ __forceinline__ float fc_f32({ty} x) {{ return to_f32_{dt}(x); }}
__device__ __forceinline__ {ty} fc_bits(float v) {{ return from_f32_{dt}(v); }}
""")
        return self[dt]


_CONVERT = _Convert()


@functools.cache   # built once per geometry: not on the call path
def rope_source(dtype: str, style: str) -> str:
    """CUDA source of ``fc_rope``: ``y[t, h, :] = x[t, h, :]`` rotated by ``pos[t] · inv[j]``
    (RoFormer, Su et al. 2021, eq. 34) on the pairs of ``style`` (neox: (j, j + r/2); gptj:
    (2j, 2j + 1)) of the first ``r`` features, fp32 math, one rounding; the rest copied. One
    thread per (row, head, pair); rows of x ``xs`` elements apart (a feature split's piece read
    in place), y contiguous."""
    ty, conv = _CONVERT[dtype]
    a, b = ("j", "j + r / 2") if style == "neox" else ("2 * j", "2 * j + 1")
    return conv + f"""
extern "C" __global__ void fc_rope(const {ty}* x, const int* pos, const float* inv, {ty}* y,
                                   int n, int heads, int d, int r, long long xs) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int half = r / 2, t = i / (heads * half), rest = i % (heads * half);
  int h = rest / half, j = rest % half;
  long long base = ((long long)t * heads + h) * d, xb = (long long)t * xs + (long long)h * d;
  int a = {a}, b = {b};
  float ang = (float)pos[t] * inv[j], c = cosf(ang), s = sinf(ang);
  float x1 = fc_f32(x[xb + a]), x2 = fc_f32(x[xb + b]);
  y[base + a] = fc_bits(x1 * c - x2 * s);
  y[base + b] = fc_bits(x2 * c + x1 * s);
  if (j == 0)
    for (int k = r; k < d; ++k) y[base + k] = x[xb + k];
}}
"""


@functools.cache   # built once per geometry: not on the call path
def write_source(dtype: str, decode: bool = False) -> str:
    """CUDA source of ``fc_kv_cache_write``: ``cache[seq_of[t], pos[t], :] = src[t, :]`` for
    rows of ``width`` elements, ``ss`` elements apart in src (a feature split's piece read in
    place); rows outside the cache skipped. One thread per element. ``decode``:
    ``fc_kv_cache_append``, row t into cache row t (``seq_of`` unread)."""
    ty, _ = _CONVERT[dtype]
    name = "fc_kv_cache_append" if decode else "fc_kv_cache_write"
    seq = "t" if decode else "seq_of[t]"
    return f"""
extern "C" __global__ void {name}(const {ty}* src, const int* seq_of, const int* pos,
                                  {ty}* cache, long long n, int seqs, int s_max,
                                  int width, long long ss) {{
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int t = (int)(i / width), e = (int)(i % width), s = {seq}, p = pos[t];
  if (s >= 0 && s < seqs && p >= 0 && p < s_max)
    cache[((long long)s * s_max + p) * width + e] = src[(long long)t * ss + e];
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
    x, xs = _rows(x)
    inv = _inv_freq(theta, rotary_dim, tuple(scaling), cupy.cuda.Device().id)
    _launch(_kernel(rope_source(dtype, style), "fc_rope"), n,
            (x, cupy.ascontiguousarray(positions), inv, out, np.int32(n), np.int32(heads),
             np.int32(d), np.int32(rotary_dim), np.int64(xs)))


def _rows(x):
    """``(x, row stride in elements)``: x itself where each row (all but the first axis) is
    contiguous, as a feature split's piece is (read in place: a copy would allocate on every
    call, inside a captured step too), else a contiguous copy."""
    import cupy
    inner = x.shape[1:]
    size = int(np.prod(inner, dtype=np.int64))
    want = tuple(x.itemsize * int(np.prod(inner[i + 1:], dtype=np.int64))
                 for i in range(len(inner)))
    if x.shape[0] > 1 and tuple(x.strides[1:]) == want and x.strides[0] > 0 and \
            x.strides[0] % x.itemsize == 0:
        return x, x.strides[0] // x.itemsize
    return (x if x.flags.c_contiguous else cupy.ascontiguousarray(x)), size


@functools.lru_cache(maxsize=64)
def _inv_freq(theta: float, rotary_dim: int, scaling: tuple, device: int):
    """The fp32 frequencies on ``device``, uploaded once per (theta, rotary_dim, scaling)
    rather than on every call (every layer of every chunk)."""
    import cupy
    from fusionc.ir.ops.rope import inv_freq
    return cupy.asarray(inv_freq(theta, rotary_dim, scaling).astype(np.float32))


def kv_cache_write(k_cache, v_cache, k, v, seq_of, positions, dtype: str) -> None:
    """``cache[seq_of[t], positions[t]] = k[t]`` (and v) in place (caches ``[N, S, KV, D]``
    contiguous, ``k``, ``v`` ``[T, KV, D]`` with contiguous rows, read in place); rows whose
    sequence or position lies outside the cache are skipped (the interpreter raises InputError
    for them). ``seq_of`` None: row t into cache row t (``kv_cache_append``)."""
    import cupy
    t = k.shape[0]
    n_seq, s_max, kvh, d = k_cache.shape
    n = t * kvh * d
    if not n:
        return
    decode = seq_of is None
    kern = _kernel(write_source(dtype, decode),
                   "fc_kv_cache_append" if decode else "fc_kv_cache_write")
    pos = cupy.ascontiguousarray(positions)
    seq = pos if decode else cupy.ascontiguousarray(seq_of)   # unread when decode
    for cache, src in ((k_cache, k), (v_cache, v)):
        src, ss = _rows(src)
        _launch(kern, n, (src, seq, pos, cache, np.int64(n), np.int32(n_seq),
                          np.int32(s_max), np.int32(kvh * d), np.int64(ss)))


@functools.cache   # built once per geometry: not on the call path
def attention_source(dtype: str, g: int, d: int, decode: bool = False) -> str:
    """CUDA source of ``fc_chunk_attention``: one warp per (row t, group of ``g`` consecutive
    query heads of one KV head j) attends them over keys ``0..positions[t]`` of sequence
    ``seq_of[t]``'s cache, 32 keys a step (a lane a key for the scores, a lane a feature for
    P·V), an online softmax in fp32 (Milakov & Gimelshein 2018; FlashAttention, Dao et al.
    2022, §3.1), fp32 math and one rounding (``fusionc/ir/ops/chunk.py``). The queries sit in
    shared memory as fp32; a row whose sequence or position is outside the cache gets zeros.
    ``decode``: ``fc_decode_attention``, row t over the first ``pos[t]`` keys of cache row t
    (``decode_attention``'s ``seq_lens``; ``seq_of`` unread), 0 keys giving zeros."""
    ty, conv = _CONVERT[dtype]
    vec = d % 8 == 0   # 16-byte K loads (8 elements of 16 bits, 4 of fp32)
    name = "fc_decode_attention" if decode else "fc_chunk_attention"
    rows = "t, n = pos[t]" if decode else "seq_of[t], n = pos[t] + 1"
    return conv + f"""
constexpr int G = {g}, D = {d}, DL = (D + 31) / 32;
#define FC_NEG_INF __int_as_float(0xff800000)
extern "C" __global__ void {name}(const {ty}* __restrict__ q,
    const {ty}* __restrict__ kc, const {ty}* __restrict__ vc, const int* __restrict__ seq_of,
    const int* __restrict__ pos, {ty}* __restrict__ out, int rows, int kvh, int seqs,
    int s_max, float scale, int heads, long long q_row) {{
  extern __shared__ float qs_all[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, groups = heads / G;
  const long long w = (long long)blockIdx.x * (blockDim.x >> 5) + warp;
  if (w >= (long long)rows * groups) return;   // no CTA barrier below
  const int t = (int)(w / groups), h0 = (int)(w % groups) * G, j = h0 / (heads / kvh);
  float* const qs = qs_all + warp * G * D;
  const {ty}* const qt = q + (long long)t * q_row + (long long)h0 * D;   // rows q_row apart
  for (int i = lane; i < G * D; i += 32) qs[i] = fc_f32(qt[i]);
  __syncwarp();
  {ty}* const ot = out + ((long long)t * heads + h0) * D;
  const int sq = {rows};
  if (sq < 0 || sq >= seqs || n < 1 || n > s_max) {{
    for (int i = lane; i < G * D; i += 32) ot[i] = fc_bits(0.f);
    return;
  }}
  const long long stride = (long long)kvh * D;   // between keys of one KV head
  const {ty}* const kb = kc + ((long long)sq * s_max * kvh + j) * D;
  const {ty}* const vb = vc + ((long long)sq * s_max * kvh + j) * D;
  float m[G], l[G], o[G][DL];
#pragma unroll
  for (int h = 0; h < G; ++h) {{
    m[h] = FC_NEG_INF; l[h] = 0.f;
#pragma unroll
    for (int i = 0; i < DL; ++i) o[h][i] = 0.f;
  }}
  for (int k0 = 0; k0 < n; k0 += 32) {{
    const int key = k0 + lane;
    float s[G];
#pragma unroll
    for (int h = 0; h < G; ++h) s[h] = 0.f;
    if (key < n) {{
      const {ty}* const kr = kb + key * stride;
{_dot(dtype, vec)}
    }}
#pragma unroll
    for (int h = 0; h < G; ++h) {{
      float x = key < n ? s[h] * scale : FC_NEG_INF, mx = x;
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float mn = fmaxf(m[h], mx), corr = expf(m[h] - mn);   // m = -inf first: corr 0
      const float p = key < n ? expf(x - mn) : 0.f;
      float ps = p;
      for (int off = 16; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
      l[h] = l[h] * corr + ps; m[h] = mn; s[h] = p;
#pragma unroll
      for (int i = 0; i < DL; ++i) o[h][i] *= corr;
    }}
    const int last = min(32, n - k0);
    for (int kk = 0; kk < last; ++kk) {{
      const {ty}* const vr = vb + (k0 + kk) * stride;
      float v[DL];
#pragma unroll
      for (int i = 0; i < DL; ++i) v[i] = lane + 32 * i < D ? fc_f32(vr[lane + 32 * i]) : 0.f;
#pragma unroll
      for (int h = 0; h < G; ++h) {{
        const float p = __shfl_sync(0xffffffffu, s[h], kk);
#pragma unroll
        for (int i = 0; i < DL; ++i) o[h][i] += p * v[i];
      }}
    }}
  }}
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int i = 0; i < DL; ++i)
      if (lane + 32 * i < D) ot[h * D + lane + 32 * i] = fc_bits(o[h][i] / l[h]);
}}
"""


def _dot(dtype: str, vec: bool) -> str:
    """The body computing ``s[h] = q_h · k`` of one key row ``kr`` (fp32 sums in feature
    order): 16-byte loads where rows allow, else one element a step."""
    if not vec:
        return """      for (int e = 0; e < D; ++e) {
        const float kv = fc_f32(kr[e]);
#pragma unroll
        for (int h = 0; h < G; ++h) s[h] += qs[h * D + e] * kv;
      }"""
    per = 4 if dtype == "f32" else 8
    unpack = ("const float kv[4] = {u.x, u.y, u.z, u.w};" if dtype == "f32" else
              "float kv[8]; const unsigned short* hs = reinterpret_cast<const unsigned short*>(&u);\n"
              "        for (int x = 0; x < 8; ++x) kv[x] = fc_f32(hs[x]);")
    load = "const float4 u = *reinterpret_cast<const float4*>(kr + e);" if dtype == "f32" else \
        "const uint4 u = *reinterpret_cast<const uint4*>(kr + e);"
    return f"""      for (int e = 0; e < D; e += {per}) {{
        {load}
        {unpack}
#pragma unroll
        for (int x = 0; x < {per}; ++x)
#pragma unroll
          for (int h = 0; h < G; ++h) s[h] += qs[h * D + e + x] * kv[x];
      }}"""


ATTN_WARPS = 8          # warps of a CTA; fewer where the queries would pass 48 KB of smem
ATTN_SMEM = 48 * 1024   # dynamic shared memory without raising the kernel's limit
ATTN_GROUP = 8          # query heads of a warp at most (their o stays in registers: no spills)


def head_group(g: int) -> int:
    """Query heads of one warp: the largest divisor of ``g`` (heads per KV head) up to
    :data:`ATTN_GROUP`."""
    return max(x for x in range(1, min(g, ATTN_GROUP) + 1) if g % x == 0)


def chunk_attention(q, k_cache, v_cache, seq_of, positions, scale: float, out,
                    dtype: str) -> None:
    """``out[t] = softmax(scale · q[t] · Kᵀ) · V`` over positions ``0..positions[t]`` of
    sequence ``seq_of[t]``'s cache (``fusionc.ir.ops.chunk``) in one launch of
    :func:`attention_source` (q ``[T, H, D]``, caches ``[N, S, KV, D]`` contiguous). The rows
    are checked on the host first (the interpreter's InputError, naming the op)."""
    import cupy
    t_, h, d = q.shape
    if not t_:
        return
    n_seq, s_max, hkv, _ = k_cache.shape
    g = head_group(h // hkv)
    from types import SimpleNamespace

    from fusionc.ir.ops.chunk import check_rows
    check_rows(SimpleNamespace(name="chunk_attention", loc=None), _host(seq_of), _host(positions),
               n_seq, s_max)
    _check_caches("chunk_attention", k_cache, v_cache)
    from fusionc.runtime import chunk_tc
    q = cupy.ascontiguousarray(q) if not q.data.ptr % 4 else q.copy()   # 32-bit q loads
    dst = out if out.flags.c_contiguous and not out.data.ptr % 4 else \
        cupy.empty(out.shape, out.dtype)
    rows = (cupy.ascontiguousarray(seq_of), cupy.ascontiguousarray(positions))
    dims = (np.int32(t_), np.int32(hkv), np.int32(n_seq), np.int32(s_max), np.float32(scale))
    if chunk_tc.covers(dtype, h // hkv, d):   # tensor cores, a sequence's rows share tiles
        kern = _kernel(chunk_tc.source(dtype, h // hkv, d, _CONVERT[dtype]),
                       "fc_chunk_attention_tc")
        kern.max_dynamic_shared_size_bytes = chunk_tc.smem_bytes(d)
        kern(chunk_tc.grid(t_, hkv, h // hkv), (32 * chunk_tc.WARPS,),
             (q, k_cache, v_cache, *rows, dst, *dims), shared_mem=chunk_tc.smem_bytes(d))
    else:
        warps = max(1, min(ATTN_WARPS, ATTN_SMEM // (g * d * 4)))
        kern = _kernel(attention_source(dtype, g, d), "fc_chunk_attention")
        smem = warps * g * d * 4
        if smem > ATTN_SMEM:   # one warp's queries alone (8 heads of head_dim > 384)
            kern.max_dynamic_shared_size_bytes = smem
        kern((-(-t_ * (h // g) // warps),), (32 * warps,),
             (q, k_cache, v_cache, *rows, dst, *dims, np.int32(h), np.int64(h * d)),
             shared_mem=smem)
    if dst is not out:
        out[...] = dst


def decode_attention(q, k_cache, v_cache, seq_lens, scale: float, out, dtype: str) -> None:
    """``decode_attention`` on the host path (``fusionc/ir/ops/attention.py``): ``out[b] =
    softmax(scale · q[b] · Kᵀ) · V`` over the first ``seq_lens[b]`` keys of cache row b, in one
    launch of :func:`attention_source` (``decode``), nothing read back or allocated where q's
    rows are contiguous and 4-byte aligned and ``out`` contiguous (a CUDA graph captures it);
    q ``[B, H, D]``, caches ``[B, S, KV, D]`` 16-byte aligned and contiguous. A row of 0 keys
    gets zeros (so does one past S, which the interpreter refuses)."""
    import cupy
    b, h, d = q.shape
    if not b:
        return
    _, s_max, hkv, _ = k_cache.shape
    _check_caches("decode_attention", k_cache, v_cache)
    g = head_group(h // hkv)
    q, q_row = _rows(q) if not q.data.ptr % 4 else (q.copy(), h * d)   # 32-bit q loads
    dst = out if out.flags.c_contiguous and not out.data.ptr % 4 else \
        cupy.empty(out.shape, out.dtype)
    warps = max(1, min(ATTN_WARPS, ATTN_SMEM // (g * d * 4)))
    kern = _kernel(attention_source(dtype, g, d, decode=True), "fc_decode_attention")
    smem = warps * g * d * 4
    if smem > ATTN_SMEM:   # one warp's queries alone (8 heads of head_dim > 384)
        kern.max_dynamic_shared_size_bytes = smem
    lens = cupy.ascontiguousarray(seq_lens)
    kern((-(-b * (h // g) // warps),), (32 * warps,),
         (q, k_cache, v_cache, lens, lens, dst, np.int32(b), np.int32(hkv), np.int32(b),
          np.int32(s_max), np.float32(scale), np.int32(h), np.int64(q_row)), shared_mem=smem)
    if dst is not out:
        out[...] = dst


def kv_cache_append(k_cache, v_cache, k, v, positions, dtype: str) -> None:
    """``kv_cache_append`` on the host path: ``cache[b, positions[b]] = k[b]`` (and v) in
    place (:func:`kv_cache_write`'s kernel with row b into cache row b; positions outside the
    cache skipped, the interpreter raises InputError for them)."""
    kv_cache_write(k_cache, v_cache, k, v, None, positions, dtype)


def _check_caches(op: str, k_cache, v_cache) -> None:
    if k_cache.data.ptr % 16 or v_cache.data.ptr % 16 or not (
            k_cache.flags.c_contiguous and v_cache.flags.c_contiguous):
        from fusionc.errors import InputError
        raise InputError("a KV cache that is not contiguous from a 16-byte aligned address",
                         op=op, valid="whole cache arrays (16-byte K/V loads)")


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
