"""``Communicator``: tensor-parallel all-reduce (optionally fused with the residual add and
RMSNorm) between the GPUs of one node over NVLink peer-to-peer, with NCCL as the fallback.

Setup (DESIGN §5, multi-GPU), in this order on every rank: allocate one region with
``cudaMalloc`` (never from a pool: IPC handles of expandable segments fail), zero it, synchronize
the device, and only then export its IPC handle and exchange handles — a peer can never signal
into flags that are zeroed later. Then open every peer's region (lazy peer access). If any rank
cannot reach a peer (no peer access, another host, an IPC call fails) every rank falls back to
NCCL, with a warning that says why. A region holds the flags (2 phases × W sources × 256 CTAs of
64-bit words) and the data slots (2 parities × W sources × ``max_bytes``); see
:mod:`fusionc.comm.kernel` for the protocol.

A communicator's CTA count is fixed (the per-CTA epochs and slot parity rely on every call
using the same grid); one communicator serves one stream at a time — use one per stream (the
flags of two streams must differ). Kernels cannot raise: a timeout or a grid mismatch writes a
host-mapped error word, which :meth:`Communicator.check` and the next call turn into
:class:`CommError`; the communicator is then broken and must be rebuilt on every rank.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import socket
import warnings

from fusionc.comm.group import Group
from fusionc.comm.kernel import ERRORS, MAX_CTAS, chunk_for, compile_spec, spec_for
from fusionc.errors import DeviceError, InputError

_DTYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


class CommError(DeviceError):
    """A collective failed on the GPU (timeout, mismatched ranks) or cannot be set up."""

    kind = "communication error"


class Communicator:
    """All-reduce over the ranks of ``group`` (default: from the environment).

    Args:
        group: a :class:`fusionc.comm.group.Group`; default ``Group.from_env()``.
        max_bytes: the largest payload per call in bytes (tokens × hidden × itemsize).
        ctas: CTAs per launch, 1..256: 16–32 suit decode (a few tokens) and leave SMs to
            compute kernels beside it; 128 moves thousands of tokens at the peer bandwidth
            (BENCHMARKS.md, TP2 table).
        timeout_s: bounded spin of the kernels, seconds (env ``FUSIONC_COMM_TIMEOUT``, 20).
        backend: ``auto`` (peer-to-peer, NCCL when that cannot be set up), ``p2p`` or ``nccl``
            (env ``FUSIONC_COMM_BACKEND``).
        two_shot_from: token count from which ``algo="auto"`` picks two-shot (None: never).
            Measured on two H200s (BENCHMARKS.md): one-shot is faster up to 512 tokens,
            two-shot from 2048.
        chunk: rows per flag signal (1, 2, 4 or 8); None picks it per call
            (:func:`fusionc.comm.kernel.chunk_for`).
    Raises:
        InputError: bad options. CommError: no backend can be set up.
    """

    def __init__(self, group: Group | None = None, *, max_bytes: int = 64 << 20,
                 ctas: int = 32, timeout_s: float | None = None, backend: str | None = None,
                 two_shot_from: int | None = 1024, chunk: int | None = None):
        import cupy
        self.group = group or Group.from_env()
        self.rank, self.world = self.group.rank, self.group.world
        backend = backend or os.environ.get("FUSIONC_COMM_BACKEND", "auto")
        if backend not in ("auto", "p2p", "nccl"):
            raise InputError(f"backend {backend!r}", valid="auto, p2p or nccl")
        if not isinstance(ctas, int) or not 1 <= ctas <= MAX_CTAS:
            raise InputError(f"ctas = {ctas!r}", valid=f"1 <= ctas <= {MAX_CTAS}")
        if not isinstance(max_bytes, int) or max_bytes < 16:
            raise InputError(f"max_bytes = {max_bytes!r}", valid="an integer >= 16")
        if chunk not in (None, 1, 2, 4, 8):
            raise InputError(f"chunk = {chunk!r}", valid="None, 1, 2, 4 or 8")
        self.ctas, self.max_bytes, self.two_shot_from = ctas, max_bytes, two_shot_from
        self.chunk = chunk
        self.timeout_ns = int(1e9 * (timeout_s if timeout_s is not None else
                                     float(os.environ.get("FUSIONC_COMM_TIMEOUT", "20"))))
        cupy.cuda.Device(self.group.local_rank).use()
        from fusionc.runtime.launch import ensure_device
        ensure_device()
        self.broken, self._opened, self._region, self.nccl = None, [], 0, None
        self._error = _HostWords(2)
        self.epochs = cupy.zeros(MAX_CTAS, cupy.uint32)
        reason = "backend=nccl was asked for" if backend == "nccl" else self._setup_p2p()
        self.backend = "p2p" if reason is None else "nccl"
        if reason is not None:
            if backend == "p2p":
                raise CommError(f"peer-to-peer setup failed: {reason}",
                                valid="GPUs of one node with peer access, or backend='nccl'")
            if backend == "auto":
                warnings.warn(f"fusionc: peer-to-peer all-reduce unavailable ({reason}); "
                              "falling back to NCCL", RuntimeWarning, stacklevel=2)
            from fusionc.comm.nccl import NcclBackend
            self.nccl = NcclBackend(self.group, max_bytes)
        self.group.barrier()

    # ---- setup ----
    def _setup_p2p(self) -> str | None:
        """Allocate, zero, sync, exchange and open the regions; None, or why it failed (the
        same answer on every rank)."""
        import cupy
        rt = cupy.cuda.runtime
        me = (socket.gethostname(), self.group.local_rank)
        where = self.group.all_gather(me)
        reason = None
        for r, (host, dev) in enumerate(where):
            if r == self.rank:
                continue
            if host != me[0]:
                reason = f"rank {r} is on another host ({host})"
            elif not rt.deviceCanAccessPeer(me[1], dev):
                reason = f"GPU {me[1]} cannot access GPU {dev} (no peer access)"
        handle = None
        if reason is None:
            try:
                self._region = rt.malloc(self.flag_bytes + 2 * self.world * self.max_bytes)
                rt.memset(self._region, 0, self.flag_bytes + 2 * self.world * self.max_bytes)
                cupy.cuda.Device().synchronize()  # zero before any peer can see the handle
                handle = rt.ipcGetMemHandle(self._region)
            except Exception as e:  # noqa: BLE001 - any CUDA failure means: fall back
                reason = f"IPC export failed on rank {self.rank}: {e}"
        reasons = self.group.all_gather((reason, handle))
        reason = next((r for r, _ in reasons if r is not None), None)
        if reason is None:
            try:
                self.bases = [self._region if r == self.rank else
                              self._open(rt, h) for r, (_, h) in enumerate(reasons)]
            except Exception as e:  # noqa: BLE001
                reason = f"IPC open failed on rank {self.rank}: {e}"
            reason = next((r for r in self.group.all_gather(reason) if r is not None), None)
        if reason is not None:
            self._release()
        return reason

    def _open(self, rt, handle) -> int:
        ptr = rt.ipcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess)
        self._opened.append(ptr)
        return ptr

    @property
    def flag_bytes(self) -> int:
        """Bytes of the flag area at the start of each region (256-byte aligned)."""
        return 2 * self.world * MAX_CTAS * 8

    def _release(self) -> None:
        import cupy
        rt = cupy.cuda.runtime
        for p in self._opened:
            try:
                rt.ipcCloseMemHandle(p)
            except Exception:  # noqa: BLE001 - teardown continues
                pass
        self._opened = []
        if self._region:
            rt.free(self._region)
            self._region = 0

    def close(self) -> None:
        """Free the buffers and close the peers' handles (all ranks should close together)."""
        if self._region:
            import cupy
            cupy.cuda.Device().synchronize()
            self.group.barrier()  # no peer still writes into this region
        self._release()
        self.group.close()

    # ---- errors ----
    def check(self, sync: bool = True) -> None:
        """Raise CommError if a kernel of this communicator has reported an error (after
        synchronizing the device when ``sync``); the communicator is then broken."""
        if sync:
            import cupy
            cupy.cuda.Device().synchronize()
        code, cta = self._error.read()
        if code and self.broken is None:
            self.broken = f"{ERRORS.get(code, f'error {code}')} (rank {self.rank}, CTA {cta})"
        if self.broken is not None:
            raise CommError(f"all-reduce failed: {self.broken}; the communicator must be "
                            "rebuilt on every rank", op="all_reduce")

    # ---- the collective ----
    def all_reduce(self, x, residual=None, weight=None, eps: float = 1e-5, *, out_y=None,
                   out_h=None, algo: str = "auto", stream=None, dtype: str | None = None,
                   scope: str = "nvlink"):
        """Sum ``x`` over the ranks; optionally ``h = sum + residual`` and ``y = rms_norm(h) ·
        weight`` (``all_reduce_add_rms_norm``, TokenWeave's fused form).

        Args:
            x, residual: ``[..., D]`` CuPy arrays or PyTorch CUDA tensors of one dtype (f16,
                bf16 — CuPy as uint16 bits with ``dtype="bf16"`` — or f32), contiguous,
                16-byte aligned, on this rank's GPU; residual and weight replicated on all ranks.
            weight: ``[D]``; with it the RMSNorm is fused (needs ``residual``).
            out_y, out_h: optional output buffers like x.
            algo: ``oneshot``, ``twoshot`` or ``auto`` (``two_shot_from``).
            stream: a CuPy stream (default: PyTorch's current one for torch tensors, else
                CuPy's).
            scope: ``nvlink`` (peer-to-peer when set up) or ``nccl`` (always NCCL; every rank
                must make the same choice, as the IR's ``scope`` attribute guarantees).
        Returns:
            h (no weight), or (y, h); same kind of array as x.
        Raises:
            InputError: bad arguments (shapes, dtypes, alignment, payload > max_bytes).
            CommError: an earlier call failed, or this communicator was closed.
        """
        from fusionc.comm.args import prepare
        self.check(sync=False)
        a = prepare(x, residual, weight, out_y, out_h, dtype, self.max_bytes)
        a.eps = float(eps)
        two = {"oneshot": False, "twoshot": True}.get(algo)
        if two is None:
            if algo != "auto":
                raise InputError(f"algo {algo!r}", op="all_reduce",
                                 valid="oneshot, twoshot or auto")
            two = self.two_shot_from is not None and a.tokens >= self.two_shot_from
        stream = stream or a.stream
        if scope not in ("nvlink", "nccl"):
            raise InputError(f"scope {scope!r}", op="all_reduce", valid="nvlink or nccl")
        if scope == "nccl" or self.backend == "nccl":
            if self.nccl is None:  # every rank reaches this call: the IR's scope is shared
                from fusionc.comm.nccl import NcclBackend
                self.nccl = NcclBackend(self.group, self.max_bytes)
            self.nccl.all_reduce(a, stream)
            self._launch(self._spec(1, a, False), a, stream, reduced=True)
        else:
            self._launch(self._spec(self.world, a, two), a, stream)
        return a.results()

    def _spec(self, world: int, a, two: bool):
        """The kernel variant of this call; the chunk from the rows each CTA reduces."""
        spec = spec_for(world, a.hidden, a.dtype, a.residual is not None, a.weight is not None,
                        two)
        rows = -(-a.tokens // world) if two else a.tokens
        chunk = min(self.chunk, spec.chunk) if self.chunk else chunk_for(rows, self.ctas,
                                                                         spec.chunk)
        return dataclasses.replace(spec, chunk=chunk)

    def _launch(self, spec, a, stream, reduced: bool = False) -> None:
        from fusionc.comm.launch import launch
        if reduced:  # add + RMSNorm of the NCCL sum, on this rank alone
            bases = [0]
            rank, x = 0, a.nccl_sum.data.ptr
        else:
            bases, rank, x = self.bases, self.rank, a.x_ptr
        launch(compile_spec(spec)[0], spec, stream, ctas=self.ctas, x=x, args=a, rank=rank,
               bases=bases, flag_bytes=self.flag_bytes, slot_bytes=self.max_bytes,
               epochs=self.epochs.data.ptr, error=self._error.device_ptr,
               timeout_ns=self.timeout_ns)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _HostWords:
    """``n`` int32 words of pinned, device-mapped host memory (``cuMemHostAlloc`` with
    DEVICEMAP), zeroed: kernels write error codes there, the host reads them without a sync."""

    def __init__(self, n: int):
        from fusionc.runtime.launch import check, driver
        cu = driver()
        flags = cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE
        self.host_ptr = int(check(cu.cuMemHostAlloc(4 * n, flags), "cuMemHostAlloc"))
        self.device_ptr = int(check(cu.cuMemHostGetDevicePointer(self.host_ptr, 0),
                                    "cuMemHostGetDevicePointer"))
        self.words = (ctypes.c_int32 * n).from_address(self.host_ptr)
        for i in range(n):
            self.words[i] = 0

    def read(self) -> tuple[int, ...]:
        return tuple(self.words)
