"""The peer-to-peer all-reduce kernel family (``templates/comm/allreduce.cu.j2``): its options,
its CUDA source and its cubin.

One kernel computes, for x ``[T, D]`` on each of W ranks (one GPU each, NVLink peer-to-peer,
no multicast), ``h = Σ_r x_r`` in fp32 in rank order rounded to the dtype, plus optionally the
residual (``h = round(round(Σ) + residual)``) and an RMSNorm ``y = (h · rsqrt(mean(h²) + eps)) ·
w`` — the roundings of the unfused ``all_reduce → add → rms_norm``, so every rank gets the same
bits and the same bits as :func:`fusionc.comm.emulate.emulate`.

Two algorithms (vLLM's custom all-reduce and TokenWeave, arXiv 2505.11329 §4, use the same pair):

* **one-shot**: every CTA pushes its rows of x into a slot of every peer with plain 16-byte P2P
  stores, then every rank reduces all T rows itself. Each rank receives (W−1)·T·D elements.
* **two-shot**: the rows are cut into W shards of ceil(T / W) (``token_shards``); rank q's rows of
  shard p go to rank p (reduce-scatter); rank p reduces, adds and normalizes its shard and pushes
  h back to every peer (all-gather), which recomputes y from h (same bits). Each rank receives
  2·(W−1)/W·T·D elements but does 1/W of the reductions.

Rows are cut into chunks of ``chunk`` rows; CTA b of a grid of n owns chunks b, b + n, …, on
every rank, so CTA b only ever talks to CTA b of the peers: a per-CTA pair of flag words replaces
grid-wide barriers. After pushing its k-th chunk, CTA b stores, with ``st.release.sys``, the flag
word ``epoch << 32 | n << 20 | k`` into its slot of every peer's flag region; the reader spins with
``ld.acquire.sys`` until the word reports at least k chunks of this epoch (or any later epoch).

* **Self-resetting flags**: each CTA keeps an epoch counter in device memory, incremented every
  call, so flags are never cleared and the kernel is CUDA-graph safe.
* **Slot reuse**: data go to slot ``epoch & 1``; a CTA writes slot p again two calls later, by
  which time its peer CTA has signalled the call in between, i.e. finished this one. This holds
  because every call of a communicator uses the same grid (fixed ``ctas``), the calls of a rank
  run in stream order on one stream, and the kernel never triggers a dependent launch early
  (no PDL): a CTA signals a call only once its rank has finished the previous one. The numpy
  emulation (:mod:`fusionc.comm.emulate`) checks the rule over sequences of calls.
* **Mismatched calls**: a 16-bit tag in every flag word hashes the grid size, algorithm, chunk
  and token count; a peer that launched another call is reported (``MISMATCH``); a CTA whose
  peer CTA does not exist times out.
* **Bounded spins and poisoning**: ``%globaltimer`` past ``timeout_ns`` (or a mismatch) makes
  the CTA write an abort word (``(rank + 1) << 8 | code``) into every rank's region and an error word (code, CTA) into
  host-mapped memory that the host turns into :class:`fusionc.comm.CommError`; every later wait
  on any rank sees the abort word and fails too (``PEER``), so no call after a failure returns
  data silently.
* Offsets are 64-bit; rows must be whole 16-byte vectors (D·itemsize % 16 == 0).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from fusionc.errors import InputError

ITEMSIZE = {"f16": 2, "bf16": 2, "f32": 4}
ERRORS = {1: "timed out waiting for a peer (a rank did not launch, or launched other sizes)",
          2: "ranks launched different calls (CTA count, token count, algorithm or chunk)",
          4: "a peer rank's all-reduce failed earlier (see that rank's error)"}
MAX_CTAS = 256


@dataclass(frozen=True)
class CommKernelSpec:
    """One compiled variant.

    Attributes:
        world: ranks W (1 = no communication: the add + RMSNorm after an NCCL all-reduce).
        hidden: elements per row D; ``dtype``: ``f16``, ``bf16`` or ``f32``.
        residual, norm: fuse the residual add; fuse the RMSNorm (needs ``residual``).
        two_shot: the two-shot algorithm (else one-shot).
        threads: CTA size (a multiple of 32, ≤ 512); ``chunk``: rows per flag signal
            (:func:`chunk_for` picks it per call).
    """

    world: int
    hidden: int
    dtype: str
    residual: bool
    norm: bool
    two_shot: bool
    threads: int
    chunk: int

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return ITEMSIZE[self.dtype]

    @property
    def vec(self) -> int:
        """Elements per 16-byte vector."""
        return 16 // self.itemsize

    @property
    def vpt(self) -> int:
        """16-byte vectors per thread per row."""
        return -(-(self.hidden // self.vec) // self.threads)

    @property
    def name(self) -> str:
        kind = ("ar_add_norm" if self.norm else "ar_add" if self.residual else "ar")
        algo = "2shot" if self.two_shot else "1shot"
        return f"fc_{kind}_{algo}_w{self.world}_{self.dtype}_d{self.hidden}_c{self.chunk}"


def spec_for(world: int, hidden: int, dtype: str, residual: bool, norm: bool,
             two_shot: bool, chunk: int | None = None) -> CommKernelSpec:
    """The variant for these sizes: threads so that one row is one 16-byte vector per thread
    (up to 512 threads, then several vectors each), chunk :func:`max_chunk` unless given.

    Raises:
        InputError: a dtype other than f16/bf16/f32, rows that are not whole 16-byte vectors
            or longer than 64 KB, a norm without residual, or world outside 1..8.
    """
    for name, v in (("world", world), ("hidden", hidden)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(f"{name} = {v!r}", op="all_reduce", valid="an integer")
    if chunk is not None and chunk not in (1, 2, 4, 8):
        raise InputError(f"chunk = {chunk!r}", op="all_reduce", valid="1, 2, 4 or 8 rows")
    if dtype not in ("f16", "bf16", "f32"):
        raise InputError(f"dtype {dtype}", op="all_reduce", valid="f16, bf16 or f32")
    if not 1 <= world <= 8:
        raise InputError(f"{world} ranks", op="all_reduce", valid="1 to 8 GPUs of one node")
    item = ITEMSIZE[dtype]
    if hidden < 1 or hidden * item % 16:
        raise InputError(f"rows of {hidden} {dtype} elements ({hidden * item} bytes)",
                         op="all_reduce", valid="rows of a multiple of 16 bytes (hidden % "
                         f"{16 // item} == 0)")
    if norm and not residual:
        raise InputError("RMSNorm without the residual add", op="all_reduce",
                         valid="all_reduce, all_reduce + add, or all_reduce + add + rms_norm")
    vecs = hidden * item // 16
    threads = min(512, -(-vecs // 32) * 32)   # 512: up to 128 registers per thread
    vpt = -(-vecs // threads)
    if vpt > 8:
        raise InputError(f"rows of {hidden * item} bytes", op="all_reduce",
                         valid="rows of at most 64 KB (512 threads × 8 vectors of 16 bytes)")
    if chunk is None:
        chunk = max_chunk(hidden * item, vpt)
    return CommKernelSpec(world, hidden, dtype, residual, norm, two_shot, threads, chunk)


def max_chunk(row_bytes: int, vpt: int) -> int:
    """The largest chunk: ≤ 8 rows, ≤ 64 KB, ≤ 8 vectors per thread (registers)."""
    return max(1, min(8, 65536 // row_bytes, 8 // vpt))


def chunk_for(rows: int, ctas: int, largest: int) -> int:
    """Rows per chunk for a call that spreads ``rows`` rows over ``ctas`` CTAs: the power of
    two that gives every CTA about one chunk, at most ``largest`` (small calls use every CTA;
    large ones amortize each flag signal over up to 64 KB)."""
    if ctas < 1 or largest < 1:
        raise InputError(f"ctas = {ctas}, largest chunk = {largest}", op="all_reduce",
                         valid="both >= 1")
    per = -(-max(rows, 1) // ctas)
    c = 1
    while c < per and c < largest:
        c *= 2
    return min(c, largest)


def render(spec: CommKernelSpec) -> str:
    """The CUDA source of ``spec`` (``templates/comm/allreduce.cu.j2``)."""
    from fusionc.codegen.render import render as jinja
    ctype = {"f16": "__half", "bf16": "__nv_bfloat16", "f32": "float"}[spec.dtype]
    return jinja("comm/allreduce.cu.j2", name=spec.name, ctype=ctype, world=spec.world,
                 hidden=spec.hidden, threads=spec.threads, vpt=spec.vpt, chunk=spec.chunk,
                 chunk_log2=spec.chunk.bit_length() - 1, max_ctas=MAX_CTAS, delay=False, residual=spec.residual, norm=spec.norm,
                 two_shot=spec.two_shot)


@functools.lru_cache(maxsize=64)
def compile_spec(spec: CommKernelSpec):
    """(CompileResult, cached) of ``spec`` for sm_90a, through fusionc's cubin cache."""
    from fusionc.runtime.cache import compile_cached
    return compile_cached(render(spec), "sm_90a", name=f"{spec.name}.cu")
