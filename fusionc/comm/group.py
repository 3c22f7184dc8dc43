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
_GROUPS: dict = {}   # one connected group per environment and process (the port is bound once)


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

    timeout: float = 600.0

    @classmethod
    def from_env(cls, timeout: float = 600.0) -> Group:
        """The group described by the torchrun-style environment variables; the same object
        for every call in a process with the same variables (communicators share it).

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
        key = (rank, world, local, os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"),
               os.environ.get("FUSIONC_PORT"))
        if key in _GROUPS and (_GROUPS[key]._conns or _GROUPS[key]._torch or world == 1):
            return _GROUPS[key]
        g = cls(rank, world, local, timeout=timeout)
        if world > 1:
            g._connect(timeout)
        _GROUPS[key] = g
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
        if not 0 < port < 65536:
            raise InputError(f"port {port} (MASTER_PORT + 1, or FUSIONC_PORT)",
                             valid="MASTER_PORT of 1..65534, or FUSIONC_PORT of 1..65535")
        if self.rank == 0:
            self._serve(Listener, addr, port, timeout)
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                c = Client((addr, port), authkey=_AUTHKEY)
                break
            except (OSError, EOFError) as e:
                if time.monotonic() > deadline:
                    raise DeviceError(f"rank {self.rank} could not reach rank 0 at "
                                      f"{addr}:{port} ({e})",
                                      valid="all ranks started, same MASTER_ADDR/PORT") from None
                time.sleep(0.05)
        c.send((self.rank, self.world))
        self._conns = [c]
        reply = self._recv(c)   # "ok" once rank 0 has every rank with the same WORLD_SIZE
        if reply != "ok":
            raise DeviceError(f"rank 0 refused rank {self.rank}: {reply}")

    def _serve(self, listener_cls, addr: str, port: int, timeout: float) -> None:
        """Rank 0: accept every other rank (each sends its rank and world size first). The
        accepts run in a helper thread so that a rank that never comes is a DeviceError after
        ``timeout`` seconds, not a hang."""
        import threading
        try:
            self._listener = listener_cls((addr, port), authkey=_AUTHKEY)
        except (OSError, OverflowError) as e:
            raise DeviceError(f"rank 0 cannot listen on {addr}:{port} ({e})",
                              valid="a free port: MASTER_PORT + 1 or FUSIONC_PORT") from None
        conns, failure = {}, []

        def accept_all():
            try:
                for _ in range(self.world - 1):
                    c = self._listener.accept()
                    rank, world = self._recv(c)
                    if world != self.world or rank in conns or not 0 < rank < self.world:
                        failure.append(f"rank {rank} has WORLD_SIZE={world}")
                        return
                    conns[rank] = c
            except Exception as e:  # noqa: BLE001 - reported below
                failure.append(f"{type(e).__name__}: {e}")
        t = threading.Thread(target=accept_all, daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive() or failure:
            self._listener.close()
            raise DeviceError(f"rank 0: ranks {sorted(conns)} connected within {timeout:.0f} s"
                              + (f"; {failure[0]}" if failure else ""),
                              valid=f"start every rank with the same WORLD_SIZE={self.world} "
                                    "and a unique RANK (fusionc launch -n WORLD_SIZE)")
        self._conns = [conns[r] for r in range(1, self.world)]
        for c in self._conns:
            c.send("ok")

    def _recv(self, c):
        if not c.poll(self.timeout):
            raise DeviceError(f"rank {self.rank}: no message from a peer within "
                              f"{self.timeout:.0f} s", valid="every rank alive and calling "
                              "the same collectives in the same order")
        try:
            return c.recv()
        except (EOFError, OSError) as e:
            raise DeviceError(f"rank {self.rank}: a peer process went away ({type(e).__name__})",
                              valid="every rank alive") from None

    def all_gather(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order.

        Raises:
            DeviceError: a peer went away or sent nothing within the group's timeout.
        """
        if self.world == 1:
            return [obj]
        if self._torch:
            import torch.distributed as dist
            out = [None] * self.world
            dist.all_gather_object(out, obj)
            return out
        try:
            if self.rank == 0:
                objs = [obj] + [self._recv(c) for c in self._conns]
                for c in self._conns:
                    c.send(objs)
                return objs
            self._conns[0].send(obj)
        except OSError as e:
            raise DeviceError(f"rank {self.rank}: a peer process went away ({e})",
                              valid="every rank alive") from None
        return self._recv(self._conns[0])

    def barrier(self) -> None:
        """Return when every rank has called barrier()."""
        self.all_gather(None)

    def close(self) -> None:
        """Close the connections (idempotent); ``from_env`` then connects anew."""
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
