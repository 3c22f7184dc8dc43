"""Process groups: which rank this process is, and exchanging small Python objects (IPC handles,
NCCL ids) between the processes of a tensor-parallel group.

One process per GPU, as in TP inference engines. The environment variables are torchrun's:
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (the GPU of this process; default ``RANK``),
``MASTER_ADDR`` (default 127.0.0.1) and ``MASTER_PORT``. ``fusionc launch`` sets them; so does
``torchrun``. When ``torch.distributed`` is already initialized its group is used; otherwise
rank 0 listens on ``MASTER_ADDR:FUSIONC_PORT`` (default ``MASTER_PORT + 1``, so that it never
takes torch's store port) with :mod:`multiprocessing.connection` and the others connect to it.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from fusionc.errors import DeviceError, InputError

_AUTHKEY = b"fusionc-group"


@dataclass
class Group:
    """A group of ``world`` processes; this one is ``rank`` and drives GPU ``local_rank``.

    ``all_gather(obj)`` returns every rank's object in rank order; ``barrier()`` waits for all.
    A group of one needs no connection.
    """

    rank: int
    world: int
    local_rank: int
    _conns: list = field(default_factory=list, repr=False)
    _listener: object = field(default=None, repr=False)
    _torch: bool = False

    @classmethod
    def from_env(cls, timeout: float = 120.0) -> "Group":
        """The group described by the torchrun-style environment variables.

        Raises:
            InputError: a variable is missing or not an integer, or RANK is out of range.
            DeviceError: the processes could not connect within ``timeout`` seconds.
        """
        world = _env_int("WORLD_SIZE", 1)
        rank = _env_int("RANK", 0)
        local = _env_int("LOCAL_RANK", rank)
        if world < 1 or not 0 <= rank < world or local < 0:
            raise InputError(f"RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local}",
                             valid="0 <= RANK < WORLD_SIZE, LOCAL_RANK >= 0")
        g = cls(rank, world, local)
        if world > 1:
            g._connect(timeout)
        return g

    def _connect(self, timeout: float) -> None:
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                self._torch = True
                return
        except ImportError:
            pass
        from multiprocessing.connection import Client, Listener
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        if "FUSIONC_PORT" not in os.environ and "MASTER_PORT" not in os.environ:
            raise InputError("WORLD_SIZE > 1 but neither MASTER_PORT nor FUSIONC_PORT is set",
                             valid="start the ranks with `fusionc launch` or torchrun")
        port = _env_int("FUSIONC_PORT", _env_int("MASTER_PORT", 0) + 1)
        if self.rank == 0:
            self._listener = Listener((addr, port), authkey=_AUTHKEY)
            conns = {}
            for _ in range(self.world - 1):
                c = self._listener.accept()
                conns[c.recv()] = c
            self._conns = [conns[r] for r in range(1, self.world)]
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                c = Client((addr, port), authkey=_AUTHKEY)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise DeviceError(f"rank {self.rank} could not reach rank 0 at "
                                      f"{addr}:{port} ({e})",
                                      valid="all ranks started, same MASTER_ADDR/PORT") from None
                time.sleep(0.05)
        c.send(self.rank)
        self._conns = [c]

    def all_gather(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order."""
        if self.world == 1:
            return [obj]
        if self._torch:
            import torch.distributed as dist
            out = [None] * self.world
            dist.all_gather_object(out, obj)
            return out
        if self.rank == 0:
            objs = [obj] + [c.recv() for c in self._conns]
            for c in self._conns:
                c.send(objs)
            return objs
        self._conns[0].send(obj)
        return self._conns[0].recv()

    def barrier(self) -> None:
        """Return when every rank has called barrier()."""
        self.all_gather(None)

    def close(self) -> None:
        """Close the connections (idempotent)."""
        for c in self._conns:
            c.close()
        self._conns = []
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"{name}={raw!r} is not an integer", valid=f"{name}=<integer>") from None
