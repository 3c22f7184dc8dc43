"""Row-wise library ops as NVRTC kernels launched with pre-packed arguments (issue 23): RMSNorm,
add, mul, SiLU·mul, SiLU, casts and the embedding gather, for the graph ops that run outside
fusionc's own kernels (prefill-sized tensors, library-path graphs, the decode step's ends).

CuPy's ``ElementwiseKernel`` / ``ReductionKernel`` resolve types, broadcast and pack their
arguments on every call: ~50 µs a kernel on the GPU machine's host (four host ops took 235 µs
a call, H100, 2026-12-07, ``benchmarks/host_overhead.py``). Here one module holds every kernel
of every dtype, compiled once through the cubin cache (no GPU needed, as fusionc's kernels), and
a :class:`RowLaunch` fixes grid, block and scalars for one shape: a launch writes the pointers
and calls ``cuLaunchKernelEx``. Operands are rows of contiguous elements (row strides given);
fp32 arithmetic, one rounding per op (the interpreter's rules). Storage as in
:mod:`fusionc.runtime.library` (bf16 as uint16 bits). Kernels are built for sm_90a, as all of
fusionc's. The cached launches (:func:`binary`, ...) are shared by every caller in the process:
like :class:`fusionc.runtime.launch.LoadedKernel`, not to be launched from two threads at once;
a call plan makes its own (``cached=False``).
"""
from __future__ import annotations

import ctypes
import functools

from fusionc.runtime import launch as _launch

THREADS = 256            # threads of a CTA; RMSNorm: one CTA a row
MAX_CTAS = 132 * 16      # elementwise grids stride past this (enough to fill an H100/H200)

STORAGE = {"f16": "unsigned short", "bf16": "unsigned short", "f32": "float"}   # C types
# storage <-> fp32, NVRTC without headers: the one definition (library_attention uses it too)
CONVERT = r"""
__device__ __forceinline__ float to_f32_f16(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short from_f32_f16(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float to_f32_bf16(unsigned short x) {
  return __uint_as_float(((unsigned int)x) << 16); }
__device__ __forceinline__ unsigned short from_f32_bf16(float v) {   // round to nearest even
  unsigned int u = __float_as_uint(v);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)((u >> 16) | 0x40u);   // NaN stays NaN
  return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16); }
__device__ __forceinline__ float to_f32_f32(float x) { return x; }
__device__ __forceinline__ float from_f32_f32(float v) { return v; }
__device__ __forceinline__ float fc_silu(float u) { return u / (1.0f + expf(-u)); }
"""
# (name, expression of u = a and v = b in fp32): Shazeer 2020 (SwiGLU) for silu_mul
BINARY = {"add": "u + v", "mul": "u * v", "silu_mul": "fc_silu(u) * v"}


def _elementwise(name: str, dt: str, body: str, ins: list[tuple[str, str]]) -> str:
    """Kernel ``fc_{name}_{dt}``: ``body`` for each element ``i`` of ``n`` in rows of ``cols``;
    operand ``x`` of ``ins`` ((name, storage) pairs) and ``y`` have row strides ``ld_x``,
    ``ld_y`` (elements), so that column slices (a split's halves) need no copy."""
    s = STORAGE[dt]
    args = "".join(f"const {t}* __restrict__ {x}, long long ld_{x}, " for x, t in ins)
    at = "".join(f"const long long at_{x} = r * ld_{x} + c; " for x, _ in ins)
    return (f'extern "C" __global__ void fc_{name}_{dt}({args}{s}* __restrict__ y, '
            f"long long ld_y, long long cols, long long n) {{\n"
            f"  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
            f"       i += (long long)gridDim.x * blockDim.x) {{\n"
            f"    const long long r = i / cols, c = i - r * cols; {at}\n"
            f"    y[r * ld_y + c] = {body};\n  }}\n}}\n")


def _rms_norm(dt: str) -> str:
    """One CTA a row: per-thread fp32 sums (strided), a warp shuffle tree, then warp 0 over the
    warps' sums (Zhang & Sennrich 2019, eq. 4: ``y = w · x · rsqrt(mean(x²) + eps)``); rows of
    x and y ``ld_x`` and ``ld_y`` elements apart."""
    s = STORAGE[dt]
    return f"""extern "C" __global__ void fc_rms_norm_{dt}(const {s}* __restrict__ x, long long ld_x,
    const {s}* __restrict__ w, long long ld_w, {s}* __restrict__ y, long long ld_y, int d,
    float eps) {{
  __shared__ float part[{THREADS // 32}];
  const {s}* const row = x + (long long)blockIdx.x * ld_x;
  float a = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {{ const float u = to_f32_{dt}(row[i]); a += u * u; }}
  for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = a;
  __syncthreads();
  if (threadIdx.x < 32) {{
    a = threadIdx.x < {THREADS // 32} ? part[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    if (threadIdx.x == 0) part[0] = rsqrtf(a / d + eps);
  }}
  __syncthreads();
  const float r = part[0];
  {s}* const out = y + (long long)blockIdx.x * ld_y;
  for (int i = threadIdx.x; i < d; i += blockDim.x)
    out[i] = from_f32_{dt}(to_f32_{dt}(w[i]) * (to_f32_{dt}(row[i]) * r));
}}
"""


def _embedding(dt: str) -> str:
    s = STORAGE[dt]   # a copy of the row's bits; ids outside [0, vocab) give zeros
    return f"""extern "C" __global__ void fc_embedding_{dt}(const {s}* __restrict__ table,
    const int* __restrict__ tokens, {s}* __restrict__ y, int vocab, int hidden, long long n) {{
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {{
    const long long b = i / hidden; const int t = tokens[b];
    y[i] = (t >= 0 && t < vocab) ? table[(long long)t * hidden + (i - b * hidden)] : ({s})0;
  }}
}}
"""


@functools.cache
def source() -> str:
    """The CUDA source of every row kernel of every dtype (NVRTC, no headers)."""
    parts = [CONVERT]
    for dt, s in STORAGE.items():
        for name, expr in BINARY.items():
            parts.append(_elementwise(name, dt, f"[&] {{ const float u = to_f32_{dt}(a[at_a]), "
                                      f"v = to_f32_{dt}(b[at_b]); return from_f32_{dt}({expr}); "
                                      f"}}()", [("a", s), ("b", s)]))
        parts.append(_elementwise("silu", dt, f"from_f32_{dt}(fc_silu(to_f32_{dt}(a[at_a])))",
                                  [("a", s)]))
        parts += [_rms_norm(dt), _embedding(dt)]
        for src, t in STORAGE.items():   # src == dt: a copy (through fp32: exact)
            parts.append(_elementwise(f"cast_{src}", dt,
                                      f"from_f32_{dt}(to_f32_{src}(a[at_a]))", [("a", t)]))
    return "\n".join(parts)


@functools.cache
def _module(device: int):
    """The loaded module of :func:`source` on ``device`` (cubin from the cache)."""
    from fusionc.runtime.cache import compile_cached
    result, _ = compile_cached(source(), name="row_kernels.cu")
    return _launch.check(_launch.driver().cuModuleLoadData(result.cubin),
                         "cuModuleLoadData (row kernels)")


class RowLaunch:
    """One row kernel at one shape: ``launch(ptrs, stream)`` with the device pointers of its
    tensors in order and a raw stream handle, the scalars packed once. A launch over nothing
    is skipped. DeviceError if the launch fails."""

    def __init__(self, kernel: str, device: int, ctas: int, scalars: tuple, tensors: int,
                 lds: tuple = ()):
        """``lds``: a row stride (elements) right after each tensor's pointer, as the
        elementwise and RMSNorm kernels take them; ``scalars`` follow the tensors."""
        cu = _launch.driver()
        self.name, self.ctas = kernel, ctas
        self.function = _launch.check(cu.cuModuleGetFunction(_module(device), kernel.encode()),
                                      f"cuModuleGetFunction {kernel}")
        self.ptrs = (ctypes.c_uint64 * tensors)()
        strides = [ctypes.c_longlong(x) for x in lds]
        self._scalars = strides + list(scalars)   # the argv slots point into these
        order = [x for i in range(tensors) for x in
                 ((ctypes.addressof(self.ptrs) + 8 * i,) +
                  ((ctypes.addressof(strides[i]),) if lds else ()))]
        order += [ctypes.addressof(x) for x in scalars]
        self.argv = (ctypes.c_void_p * len(order))(*order)
        self.address = ctypes.addressof(self.argv)
        self._configs: dict = {}
        self._go = cu.cuLaunchKernelEx

    def __call__(self, ptrs, stream: int) -> None:
        if not self.ctas:
            return
        self.ptrs[:] = ptrs
        cfg = self._configs.get(stream)
        if cfg is None:
            cfg = self._config(stream)
        r = self._go(cfg, self.function, self.address, 0)
        if r[0]:
            _launch.check(r, f"launching {self.name}")

    def _config(self, stream: int):
        cfg = _launch.grid_config(stream, self.ctas, THREADS)
        if len(self._configs) >= 64:
            self._configs.clear()
        self._configs[stream] = cfg
        return cfg


def _ctas(n: int) -> int:
    return min(-(-n // THREADS), MAX_CTAS)


def _cached(make):
    """``make(..., cached=True)`` through a process-wide cache of launches (the general path);
    ``cached=False``: a launch of the caller's own (a call plan's step)."""
    shared = functools.lru_cache(maxsize=1024)(make)

    @functools.wraps(make)
    def get(*args, cached: bool = True):
        return shared(*args) if cached else make(*args)
    get.cache_clear = shared.cache_clear
    return get


@_cached
def binary(name: str, dt: str, n: int, cols: int, lds: tuple, device: int) -> RowLaunch:
    """``y = a ∘ b`` (:data:`BINARY` ``name``) over ``n`` elements in rows of ``cols``, row
    strides ``lds`` (a, b, y; elements): pointers (a, b, y)."""
    return _strided(f"fc_{name}_{dt}", device, n, cols, lds)


@_cached
def unary(name: str, src: str, dst: str, n: int, cols: int, lds: tuple,
          device: int) -> RowLaunch:
    """``y = silu(a)`` (``name`` "silu", src == dst) or the cast ``src`` → ``dst``
    (``name`` "cast"; a copy when they are equal) over ``n`` elements in rows of ``cols``, row
    strides ``lds`` (a, y): pointers (a, y)."""
    kernel = f"fc_silu_{dst}" if name == "silu" else f"fc_cast_{src}_{dst}"
    return _strided(kernel, device, n, cols, lds)


def _strided(kernel: str, device: int, n: int, cols: int, lds: tuple) -> RowLaunch:
    """An elementwise launch: argument order (x, ld_x)..., (y, ld_y), cols, n."""
    return RowLaunch(kernel, device, _ctas(n) if cols else 0,
                     (ctypes.c_longlong(max(cols, 1)), ctypes.c_longlong(n)), len(lds), lds)


@_cached
def rms_norm(dt: str, rows: int, d: int, eps: float, lds: tuple, device: int) -> RowLaunch:
    """RMSNorm of ``rows`` rows of ``d``, row strides ``lds`` (x, w, y): pointers (x, w, y)."""
    return RowLaunch(f"fc_rms_norm_{dt}", device, rows if d else 0,
                     (ctypes.c_int(d), ctypes.c_float(eps)), 3, lds)


@_cached
def embedding(dt: str, rows: int, vocab: int, hidden: int, device: int) -> RowLaunch:
    """``y[b] = table[tokens[b]]`` for ``rows`` ids: pointers (table, tokens, y)."""
    n = rows * hidden
    return RowLaunch(f"fc_embedding_{dt}", device, _ctas(n),
                     (ctypes.c_int(vocab), ctypes.c_int(hidden), ctypes.c_longlong(n)), 3)


def clear() -> None:
    """Forget the loaded module and every launch (a new context, or a faked driver's
    objects: ``benchmarks/cpu_fakes.py``)."""
    for f in (_module, binary, unary, rms_norm, embedding):
        f.cache_clear()
