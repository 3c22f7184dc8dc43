"""``Communicator``: tensor-parallel all-reduce (optionally fused with the residual add and
RMSNorm) between the GPUs of one node over NVLink peer-to-peer, with NCCL as the fallback.

Setup and teardown of the IPC-shared regions: :mod:`fusionc.comm.ipc`; if any rank cannot
reach a peer (no peer access, another host, an IPC call fails) every rank falls back to NCCL,
with a warning that says why. The options must be equal on every rank; they are compared at
setup. A communicator's CTA count is fixed (the per-CTA epochs and slot parity rely on every
call using the same grid), and one communicator serves one stream at a time (build one per
stream: two streams must not share flags). Kernels cannot raise: a timeout or a mismatched call
writes a host-mapped error word and poisons the communicator on every rank; :meth:`check` and
the next call turn that into :class:`CommError`, and the communicator must then be rebuilt on
every rank. A call that returns has only been queued: its outputs are valid once the stream has
reached it and ``check()`` has not raised.
"""
from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import warnings

from fusionc.comm.group import Group
from fusionc.comm.ipc import PeerRegions
from fusionc.comm.kernel import ERRORS, MAX_CTAS, chunk_for, compile_spec, spec_for
from fusionc.errors import DeviceError, InputError


class CommError(DeviceError):
    """A collective failed on the GPU (timeout, mismatched ranks) or cannot be set up."""

    kind = "communication error"


class Communicator:
    """All-reduce over the ranks of ``group`` (default: ``Group.from_env()``).

    Args:
        group: a :class:`fusionc.comm.group.Group`.
        max_bytes: the largest payload per call in bytes (tokens × hidden × itemsize),
            rounded up to 256.
        ctas: CTAs per launch, 1..256: 16–32 suit decode (a few tokens) and leave SMs to
            compute kernels beside it; 128 moves thousands of tokens at the peer bandwidth
            (BENCHMARKS.md, TP2 table).
        timeout_s: bounded spin of the kernels in seconds, > 0 (env ``FUSIONC_COMM_TIMEOUT``,
            default 20).
        backend: ``auto`` (peer-to-peer, NCCL when that cannot be set up), ``p2p`` or ``nccl``
            (env ``FUSIONC_COMM_BACKEND``).
        two_shot_from: token count from which ``algo="auto"`` picks two-shot (None: never).
            Measured on two H200s (BENCHMARKS.md): one-shot is faster up to 512 tokens,
            two-shot from 1024.
        chunk: rows per flag signal (1, 2, 4 or 8); None picks it per call
            (:func:`fusionc.comm.kernel.chunk_for`).
    Raises:
        InputError: bad options, or options that differ between ranks.
        DeviceError: no usable GPU. CommError: no backend can be set up.
    """

    def __init__(self, group: Group | None = None, *, max_bytes: int = 64 << 20,
                 ctas: int = 32, timeout_s: float | None = None, backend: str | None = None,
                 two_shot_from: int | None = 1024, chunk: int | None = None):
        backend = backend or os.environ.get("FUSIONC_COMM_BACKEND", "auto")
        timeout_s = _timeout(timeout_s)
        _check_options(backend, ctas, max_bytes, two_shot_from, chunk)
        if group is not None and not isinstance(group, Group):
            raise InputError(f"group is a {type(group).__name__}", op="Communicator",
                             valid="None (from the environment) or a fusionc.comm.Group")
        from fusionc.comm.group import (
            _env_int,  # the GPU first: no rendezvous without one
        )
        _use_device(group.local_rank if group else _env_int("LOCAL_RANK", _env_int("RANK", 0)))
        self.group = group or Group.from_env()
        self.rank, self.world = self.group.rank, self.group.world
        self.ctas, self.two_shot_from, self.chunk = ctas, two_shot_from, chunk
        self.max_bytes = -(-max_bytes // 256) * 256
        self.timeout_ns = int(1e9 * timeout_s)
        self.broken, self.nccl, self.peers, self._sides = None, None, None, {}
        settings = (self.max_bytes, ctas, two_shot_from, chunk, backend, self.timeout_ns)
        theirs = self.group.all_gather(settings)
        if any(s != settings for s in theirs):
            raise InputError(f"rank {self.rank} has Communicator settings {settings}, other "
                             f"ranks {theirs}", op="Communicator",
                             valid="the same max_bytes, ctas, two_shot_from, chunk, backend and "
                                   "timeout on every rank")
        import cupy
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
            self._nccl()
        self.group.barrier()

    def _setup_p2p(self) -> str | None:
        self.peers = PeerRegions(self.group, self.max_bytes)
        reason = self.peers.setup()
        if reason is not None:
            self.peers = None
        return reason

    def _nccl(self):
        """The NCCL backend, created on first use (every rank reaches the same call)."""
        if self.nccl is None:
            from fusionc.comm.nccl import NcclBackend
            self.nccl = NcclBackend(self.group, self.max_bytes)
        return self.nccl

    @property
    def bases(self) -> list[int]:
        """Every rank's region mapped into this process (peer-to-peer backend)."""
        return self.peers.bases if self.peers else []

    @property
    def flag_bytes(self) -> int:
        return self.peers.flag_bytes if self.peers else 0

    def side(self, ctas: int) -> Communicator:
        """A communicator for a second stream (its own flags; same group and options but
        ``ctas``), created on first use — a collective call: every rank must reach it, and
        not while a CUDA graph is being captured — and checked and closed with this one.

        Raises:
            CommError: called during a capture.
        """
        if ctas not in self._sides:
            import cupy
            if cupy.cuda.get_current_stream().is_capturing():
                raise CommError("the side-stream communicator would be created during a "
                                "CUDA-graph capture", op="all_reduce",
                                valid="run the graph once before capturing it")
            self._sides[ctas] = Communicator(
                self.group, max_bytes=self.max_bytes, ctas=ctas,
                timeout_s=self.timeout_ns / 1e9, backend=self.backend,
                two_shot_from=self.two_shot_from, chunk=self.chunk)
        return self._sides[ctas]

    def close(self) -> None:
        """Release the regions, this communicator's and its side communicators' (every rank
        must call it, together); later calls raise CommError. The process group stays open for
        other communicators."""
        if self.broken == "closed":
            return
        for s in self._sides.values():
            s.close()
        if self.peers is not None:
            self.peers.release()
            self.peers = None
        if self.nccl is not None:
            self.nccl.close()
            self.nccl = None
        self._error.free()
        self.broken = "closed"

    def check(self, sync: bool = True) -> None:
        """Raise CommError if a kernel of this communicator has reported an error (after
        synchronizing the device when ``sync``), or if it is closed.

        Raises:
            CommError: the communicator is broken and must be rebuilt on every rank.
        """
        if sync and self.broken is None:
            import cupy
            cupy.cuda.Device().synchronize()
        for s in self._sides.values():
            s.check(sync=False)
        code, cta = self._error.read() if self.broken is None else (0, 0)
        if code:
            self.broken = f"{ERRORS.get(code, f'error {code}')} (rank {self.rank}, CTA {cta})"
        if self.broken == "closed":
            raise CommError("the communicator is closed", op="all_reduce",
                            valid="a new Communicator")
        if self.broken is not None:
            raise CommError(f"all-reduce failed: {self.broken}; the communicator must be "
                            "rebuilt on every rank", op="all_reduce")

    def all_reduce(self, x, residual=None, weight=None, eps: float = 1e-5, *, out_y=None,
                   out_h=None, algo: str = "auto", stream=None, dtype: str | None = None,
                   scope: str = "nvlink"):
        """Sum ``x`` over the ranks; optionally ``h = sum + residual`` and ``y = rms_norm(h) ·
        weight`` (``all_reduce_add_rms_norm``, TokenWeave's fused form); queued on ``stream``.

        Args:
            x, residual: ``[..., D]`` CuPy arrays or PyTorch CUDA tensors of one dtype (f16,
                bf16 — CuPy as uint16 bits with ``dtype="bf16"`` — or f32), contiguous,
                16-byte aligned rows, on this rank's GPU; residual and weight replicated.
            weight: ``[D]``; with it the RMSNorm is fused (needs ``residual``).
            eps: RMSNorm epsilon (finite, >= 0), inside the square root.
            out_y, out_h: optional output buffers like x (``out_y`` only with ``weight``).
            algo: ``oneshot``, ``twoshot`` or ``auto`` (``two_shot_from``).
            stream: a CuPy or PyTorch stream (default: PyTorch's current one for torch
                tensors, else CuPy's).
            dtype: ``bf16`` for CuPy uint16 bit patterns; otherwise it must match x.
            scope: ``nvlink`` (peer-to-peer when set up) or ``nccl`` (always NCCL; every rank
                must make the same choice, as the IR's ``scope`` attribute guarantees).
        Returns:
            h (no weight), or (y, h); the same kind of array as x.
        Raises:
            InputError: bad arguments (shapes, dtypes, alignment, payload > max_bytes).
            CommError: an earlier call failed, or this communicator is closed.
        """
        from fusionc.comm.args import as_stream, prepare
        self.check(sync=False)
        if scope not in ("nvlink", "nccl") or algo not in ("auto", "oneshot", "twoshot"):
            raise InputError(f"scope {scope!r}, algo {algo!r}", op="all_reduce",
                             valid="scope nvlink or nccl; algo auto, oneshot or twoshot")
        a = prepare(x, residual, weight, out_y, out_h, dtype, self.max_bytes, eps)
        two = algo == "twoshot" or (algo == "auto" and self.two_shot_from is not None
                                    and a.tokens >= self.two_shot_from)
        stream = as_stream(stream) or a.stream
        if a.tokens == 0:   # every rank has the same shapes: all skip the launch
            return a.results()
        if scope == "nccl" or self.backend == "nccl":
            self._nccl().all_reduce(a, stream)
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
        if -(-rows // chunk) > self.ctas * 0xffff:   # 16-bit chunk counts in the flag words
            raise InputError(f"{a.tokens} tokens in chunks of {chunk} over {self.ctas} CTAs",
                             op="all_reduce", valid="fewer than 65536 chunks per CTA (more "
                             "ctas, or a larger chunk)")
        return dataclasses.replace(spec, chunk=chunk)

    def _launch(self, spec, a, stream, reduced: bool = False) -> None:
        from fusionc.comm.launch import launch
        if reduced:  # add + RMSNorm of the NCCL sum, on this rank alone
            bases, rank, x = [0], 0, a.nccl_sum.data.ptr
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


def _timeout(timeout_s) -> float:
    if timeout_s is None:
        raw = os.environ.get("FUSIONC_COMM_TIMEOUT", "20")
        try:
            timeout_s = float(raw)
        except ValueError:
            raise InputError(f"FUSIONC_COMM_TIMEOUT={raw!r}", op="Communicator",
                             valid="seconds, a number > 0") from None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or \
            not 0 < timeout_s < math.inf:
        raise InputError(f"timeout_s = {timeout_s!r}", op="Communicator",
                         valid="seconds, a finite number > 0")
    return float(timeout_s)


def _check_options(backend, ctas, max_bytes, two_shot_from, chunk) -> None:
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)
    bad = [(backend not in ("auto", "p2p", "nccl"), f"backend {backend!r}", "auto, p2p or nccl"),
           (not is_int(ctas) or not 1 <= ctas <= MAX_CTAS, f"ctas = {ctas!r}",
            f"1 <= ctas <= {MAX_CTAS}"),
           (not is_int(max_bytes) or max_bytes < 16, f"max_bytes = {max_bytes!r}",
            "an integer >= 16"),
           (two_shot_from is not None and (not is_int(two_shot_from) or two_shot_from < 1),
            f"two_shot_from = {two_shot_from!r}", "None or a positive token count"),
           (chunk not in (None, 1, 2, 4, 8), f"chunk = {chunk!r}", "None, 1, 2, 4 or 8")]
    for wrong, what, valid in bad:
        if wrong:
            raise InputError(what, op="Communicator", valid=valid)


def _use_device(ordinal: int) -> None:
    """Make GPU ``ordinal`` current (CuPy and the driver); DeviceError when it cannot be."""
    try:
        import cupy
        cupy.cuda.Device(ordinal).use()
    except Exception as e:  # noqa: BLE001 - no CUDA, no such GPU
        raise DeviceError(f"cannot use GPU {ordinal} ({type(e).__name__}: {e})",
                          valid="a CUDA GPU and driver, and LOCAL_RANK below the number of "
                                "GPUs of this node") from None
    from fusionc.runtime.launch import ensure_device
    ensure_device()


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

    def free(self) -> None:
        if self.host_ptr:
            from fusionc.runtime.launch import check, driver
            check(driver().cuMemFreeHost(self.host_ptr), "cuMemFreeHost")
            self.host_ptr, self.words = 0, (0, 0)
