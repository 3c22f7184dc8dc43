"""The IPC-shared regions of a peer-to-peer communicator (one per rank), set up and torn down
in the order that keeps every rank safe.

Setup, on every rank: allocate one region with ``cudaMalloc`` (never from a memory pool: IPC
handles of expandable segments fail), zero it, synchronize the device, and only then export its
handle and exchange handles — no peer can signal into flags that are zeroed later; then open
every peer's region (lazy peer access). Every step's outcome is exchanged, so all ranks agree
on success or on the same reason for failure. Teardown: synchronize, close the peers' regions,
wait for every rank, and only then free this rank's region (a peer may hold it open until then).

Region layout: flags (2 phases × W source ranks × 256 CTAs of 64-bit words), one abort word,
padding to 256 bytes; then the data slots (2 parities × W source ranks × ``slot_bytes``).
"""
from __future__ import annotations

import socket

from fusionc.comm.kernel import MAX_CTAS


def flag_bytes(world: int) -> int:
    """Bytes before the data slots: the flag words and the abort word, 256-byte aligned."""
    return -(-(2 * world * MAX_CTAS + 1) * 8 // 256) * 256


class PeerRegions:
    """This rank's region and every peer's, mapped into this process (``bases[r]``)."""

    def __init__(self, group, slot_bytes: int):
        self.group, self.slot_bytes = group, slot_bytes
        self.flag_bytes = flag_bytes(group.world)
        self.size = self.flag_bytes + 2 * group.world * slot_bytes
        self.bases, self._opened, self._own = [], [], 0

    def setup(self) -> str | None:
        """Set up (see the module docstring); None, or why it failed — the same on every rank.
        On failure nothing stays allocated or open."""
        import cupy
        rt = cupy.cuda.runtime
        reason = self._reachable(rt)
        handle = None
        if reason is None:
            try:
                self._own = rt.malloc(self.size)
                rt.memset(self._own, 0, self.size)
                cupy.cuda.Device().synchronize()  # zero before any peer can see the handle
                handle = rt.ipcGetMemHandle(self._own)
            except Exception as e:  # noqa: BLE001 - any CUDA failure means: fall back
                reason = f"IPC export failed on rank {self.group.rank}: {e}"
        answers = self.group.all_gather((reason, handle))
        reason = next((r for r, _ in answers if r is not None), None)
        if reason is None:
            try:
                for r, (_, h) in enumerate(answers):
                    self.bases.append(self._own if r == self.group.rank else self._open(rt, h))
            except Exception as e:  # noqa: BLE001
                reason = f"IPC open failed on rank {self.group.rank}: {e}"
            reason = next((r for r in self.group.all_gather(reason) if r is not None), None)
        if reason is not None:
            self.release()
        return reason

    def _reachable(self, rt) -> str | None:
        me = (socket.gethostname(), self.group.local_rank)
        for r, (host, dev) in enumerate(self.group.all_gather(me)):
            if r == self.group.rank:
                continue
            if host != me[0]:
                return f"rank {r} is on another host ({host})"
            if not rt.deviceCanAccessPeer(me[1], dev):
                return f"GPU {me[1]} cannot access GPU {dev} (no peer access)"
        return None

    def _open(self, rt, handle) -> int:
        ptr = rt.ipcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess)
        self._opened.append(ptr)
        return ptr

    def release(self) -> None:
        """Close the peers' regions, wait for every rank, free this one (idempotent; every rank
        must call it)."""
        import cupy
        rt = cupy.cuda.runtime
        cupy.cuda.Device().synchronize()
        for p in self._opened:
            try:
                rt.ipcCloseMemHandle(p)
            except Exception:  # noqa: BLE001,S110 - teardown goes on; the region is freed below
                pass
        self._opened, self.bases = [], []
        self.group.barrier()   # no peer still maps this rank's region
        if self._own:
            rt.free(self._own)
            self._own = 0
