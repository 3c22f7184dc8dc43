"""``chunk_attention`` on tensor cores (issue 25): FlashAttention-2
(Dao 2023, §3.1) over a prompt chunk's rows. A CTA of four warps takes 64 queries of one KV head
— ``64 / g`` consecutive rows × the ``g`` query heads sharing it — so a sequence's rows share each
tile of :data:`KEYS` keys in shared memory, loaded by cp.async one tile ahead (:data:`STAGES`). Each warp holds 16 queries: S = Q·Kᵀ and O += P·V by
mma.sync m16n8k16 (fp32 accumulation, P rounded to the cache dtype), the online softmax in fp32
on the accumulators' rows (four lanes a row). Rows of several sequences in one CTA take one pass
over the keys per sequence (uniform over the CTA); keys past the longest row of a pass load as
zeros. 16-bit dtypes, ``g`` a power of two up to 16, head_dim a multiple of 16 up to 128 (256 spills:
Q's fragments and O take 192 registers).

Numerics differ from the CUDA-core kernel's "fp32 math, one rounding": P is rounded to the cache
dtype for the mma (as FlashAttention does; the softmax's sum stays fp32). And a row's zero
weights still multiply every key of its pass up to the CTA's longest row: slots below that
position must be finite (a 0 · NaN is NaN), as the decoder's zeroed caches are. The grid has no
split over the keys: a short chunk at a long position runs few CTAs (a small-grid fallback to
the CUDA-core kernel is a next step).
"""
from __future__ import annotations

import functools

KEYS = 64       # keys of a tile
WARPS = 4       # 16 queries each
STAGES = 2      # cp.async stages: tile t + 1 loads while tile t is computed


def covers(dtype: str, g: int, d: int) -> bool:
    """Whether this kernel takes the geometry (else the CUDA-core kernel)."""
    return dtype in ("f16", "bf16") and g in (1, 2, 4, 8, 16) and d % 16 == 0 and d <= 128


def rows_per_cta(g: int) -> int:
    return 16 * WARPS // g


def smem_bytes(d: int) -> int:
    """Two stages of the K and V tiles (16-bit, rows padded by 8 elements: 16-byte aligned, no
    bank conflicts); 68 KB at head_dim 128, past the 48 KB default (the launch raises it)."""
    return STAGES * 2 * KEYS * (d + 8) * 2


def grid(rows: int, kvh: int, g: int) -> tuple[int, int]:
    return -(-rows // rows_per_cta(g)), kvh


@functools.cache   # built once per geometry: not on the call path
def source(dtype: str, g: int, d: int, convert: tuple[str, str]) -> str:
    """CUDA source of ``fc_chunk_attention_tc`` (``convert``: the storage type and the
    ``fc_f32`` / ``fc_bits`` conversions of ``dtype``)."""
    ty, conv = convert
    mma = "bf16" if dtype == "bf16" else "f16"
    return conv + f"""
constexpr int G = {g}, D = {d}, KT = {KEYS}, NW = {WARPS}, RS = D + 8, RPW = 16 / G;
constexpr int RPC = RPW * NW, NK = D / 16, NS = KT / 8, ND = D / 8;
#define FC_NEG_INF __int_as_float(0xff800000)
__device__ __forceinline__ void fc_mma(float* c, const unsigned* a, const unsigned* b) {{
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{mma}.{mma}.f32 {{%0,%1,%2,%3}}, "
               "{{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}}
__device__ __forceinline__ void fc_ldsm_x2_trans(unsigned* r, const void* p) {{
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {{%0,%1}}, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}}
__device__ __forceinline__ unsigned fc_pack(float lo, float hi) {{
  return (unsigned)fc_bits(lo) | ((unsigned)fc_bits(hi) << 16);
}}
__device__ __forceinline__ void fc_cp_async(void* dst, const void* src, int bytes) {{
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);   // bytes < 16: zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(src), "r"(bytes)
               : "memory");
}}
// tile t of keys (K at dst, V after it) in one commit group; keys at or past top read as zeros
__device__ __forceinline__ void fc_fetch({ty}* dst, const {ty}* kb, const {ty}* vb,
                                         long long stride, int t, int top) {{
#pragma unroll
  for (int c = 0; c < KT * (D / 8) / (32 * NW); ++c) {{
    const int i = threadIdx.x + c * 32 * NW, key = i / (D / 8), e = (i % (D / 8)) * 8;
    const int kk = t * KT + key;
    const long long off = (long long)(kk < top ? kk : 0) * stride + e;
    fc_cp_async(dst + key * RS + e, kb + off, kk < top ? 16 : 0);
    fc_cp_async(dst + (KT + key) * RS + e, vb + off, kk < top ? 16 : 0);
  }}
  asm volatile("cp.async.commit_group;" ::: "memory");
}}
extern "C" __global__ void __launch_bounds__(32 * NW, 1) fc_chunk_attention_tc(
    const {ty}* __restrict__ q, const {ty}* __restrict__ kc, const {ty}* __restrict__ vc,
    const int* __restrict__ seq_of, const int* __restrict__ pos, {ty}* __restrict__ out,
    int rows, int kvh, int seqs, int s_max, float scale) {{
  extern __shared__ __align__(16) {ty} sm[];
  {ty}* const ks = sm;   // two stages of [K tile, V tile], each [KT][RS]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int j = blockIdx.y, heads = kvh * G, t0 = blockIdx.x * RPC;
  auto ok = [&](int r) {{   // row r exists and lies inside the cache (uniform over the CTA)
    if (r >= rows) return false;
    const int s = seq_of[r], n = pos[r] + 1;
    return s >= 0 && s < seqs && n >= 1 && n <= s_max;
  }};
  // this lane's two query rows: m = gq and gq + 8 of the warp's 16 (row m / G, head m % G)
  int tr[2], hd[2], sq[2], nr[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {{
    const int m = gq + 8 * i;
    tr[i] = t0 + warp * RPW + m / G; hd[i] = j * G + m % G;
    const bool v = ok(tr[i]);
    sq[i] = v ? seq_of[tr[i]] : -1; nr[i] = v ? pos[tr[i]] + 1 : 0;
  }}
  unsigned qa[NK][4];   // Q as A fragments: {{Q[g][2t..], Q[g+8][2t..], Q[g][2t+8..], Q[g+8][2t+8..]}}
#pragma unroll
  for (int kk = 0; kk < NK; ++kk)
#pragma unroll
    for (int x = 0; x < 4; ++x) {{
      const int i = x & 1, col = 16 * kk + 2 * tq + (x >> 1) * 8;
      qa[kk][x] = tr[i] < rows ? *reinterpret_cast<const unsigned*>(
          q + ((long long)tr[i] * heads + hd[i]) * D + col) : 0u;
    }}
  float o[ND][4], m[2] = {{FC_NEG_INF, FC_NEG_INF}}, l[2] = {{0.f, 0.f}};
#pragma unroll
  for (int a = 0; a < ND; ++a) o[a][0] = o[a][1] = o[a][2] = o[a][3] = 0.f;
  for (int r = t0; r < t0 + RPC && r < rows; ++r) {{   // one pass per sequence of the CTA
    if (!ok(r)) continue;
    const int s = seq_of[r];
    bool first = true;
    for (int u = t0; u < r && first; ++u) first = !(ok(u) && seq_of[u] == s);
    if (!first) continue;
    int top = 0;
    for (int u = r; u < t0 + RPC && u < rows; ++u)
      if (ok(u) && seq_of[u] == s) top = max(top, pos[u] + 1);
    const long long stride = (long long)kvh * D;
    const {ty}* const kb = kc + ((long long)s * s_max * kvh + j) * D;
    const {ty}* const vb = vc + ((long long)s * s_max * kvh + j) * D;
    const int tiles = (top + KT - 1) / KT;
    __syncthreads();   // every warp is done with the previous pass's stages
    fc_fetch(ks, kb, vb, stride, 0, top);
    for (int t = 0; t < tiles; ++t) {{
      const int k0 = t * KT;
      __syncthreads();   // every warp is done with tile t - 1: its stage takes tile t + 1
      if (t + 1 < tiles) fc_fetch(ks + ((t + 1) & 1) * 2 * KT * RS, kb, vb, stride, t + 1, top);
      else asm volatile("cp.async.commit_group;" ::: "memory");   // keeps wait_group 1 exact
      asm volatile("cp.async.wait_group 1;" ::: "memory");
      __syncthreads();   // tile t is in shared memory for every warp
      const {ty}* const kt = ks + (t & 1) * 2 * KT * RS;
      const {ty}* const vt = kt + KT * RS;
      const bool act0 = sq[0] == s && k0 < nr[0], act1 = sq[1] == s && k0 < nr[1];
      if (!__any_sync(0xffffffffu, act0 || act1)) continue;   // warp-uniform
      float sc[NS][4];
#pragma unroll
      for (int a = 0; a < NS; ++a) {{
        sc[a][0] = sc[a][1] = sc[a][2] = sc[a][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < NK; ++kk) {{   // B[k][n] = K[n][k]: two 32-bit reads of row n
          const {ty}* const kr = kt + (a * 8 + gq) * RS + 16 * kk + 2 * tq;
          const unsigned b[2] = {{*reinterpret_cast<const unsigned*>(kr),
                                 *reinterpret_cast<const unsigned*>(kr + 8)}};
          fc_mma(sc[a], qa[kk], b);
        }}
      }}
      float mx[2] = {{FC_NEG_INF, FC_NEG_INF}};
#pragma unroll
      for (int a = 0; a < NS; ++a)
#pragma unroll
        for (int x = 0; x < 4; ++x) {{
          const int i = x >> 1, key = k0 + a * 8 + 2 * tq + (x & 1);
          const bool v = sq[i] == s && key < nr[i];
          sc[a][x] = v ? sc[a][x] * scale : FC_NEG_INF;
          mx[i] = fmaxf(mx[i], sc[a][x]);
        }}
      float corr[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {{   // the row's four lanes: xor 1 and 2
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float mn = fmaxf(m[i], mx[i]);
        corr[i] = mn == FC_NEG_INF ? 1.f : expf(m[i] - mn);   // m = -inf first: 0
        m[i] = mn;
        l[i] *= corr[i];
      }}
#pragma unroll
      for (int a = 0; a < NS; ++a)
#pragma unroll
        for (int x = 0; x < 4; ++x) {{
          const int i = x >> 1;
          const float p = sc[a][x] == FC_NEG_INF ? 0.f : expf(sc[a][x] - m[i]);
          sc[a][x] = p;
          l[i] += p;
        }}
#pragma unroll
      for (int a = 0; a < ND; ++a) {{
        o[a][0] *= corr[0]; o[a][1] *= corr[0]; o[a][2] *= corr[1]; o[a][3] *= corr[1];
      }}
#pragma unroll
      for (int kk = 0; kk < KT / 16; ++kk) {{   // P as A fragments (the S accumulators' layout)
        const unsigned pa[4] = {{fc_pack(sc[2 * kk][0], sc[2 * kk][1]),
                                fc_pack(sc[2 * kk][2], sc[2 * kk][3]),
                                fc_pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                fc_pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3])}};
#pragma unroll
        for (int a = 0; a < ND; ++a) {{   // B[k][n] = V[k][n]: ldmatrix.trans of rows k
          unsigned b[2];
          fc_ldsm_x2_trans(b, vt + (16 * kk + (lane & 15)) * RS + a * 8);
          fc_mma(o[a], pa, b);
        }}
      }}
    }}
  }}
#pragma unroll
  for (int i = 0; i < 2; ++i) {{
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }}
#pragma unroll
  for (int i = 0; i < 2; ++i) {{
    if (tr[i] >= rows) continue;
    const bool v = sq[i] >= 0;
    {ty}* const ot = out + ((long long)tr[i] * heads + hd[i]) * D + 2 * tq;
#pragma unroll
    for (int a = 0; a < ND; ++a)
      *reinterpret_cast<unsigned*>(ot + a * 8) =
          fc_pack(v ? o[a][2 * i] / l[i] : 0.f, v ? o[a][2 * i + 1] / l[i] : 0.f);
  }}
}}
"""
