"""Start one process per GPU (``fusionc launch``): torchrun's environment variables, NVLink
multicast off, rank-prefixed output, and every rank stopped when one fails."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from fusionc.errors import InputError

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    """A TCP port that is free now on 127.0.0.1 (and, very likely, the one above it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int, base: dict | None = None) -> dict:
    """The environment of rank ``rank``: torchrun's variables and multicast off."""
    env = dict(os.environ if base is None else base)
    env.update(SAFE_ENV)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env


def launch(cmd: list[str], nproc: int, port: int = 0, timeout: float | None = None) -> int:
    """Run ``cmd`` on ``nproc`` ranks; returns the first non-zero exit status, else 0, or 124
    when ``timeout`` (seconds, None: no limit) passes first.

    Raises:
        InputError: no command given, or it cannot be started.
    """
    if not cmd:
        raise InputError("no command to launch", op="launch",
                         valid="fusionc launch -n 2 -- python3 script.py")
    if not 1 <= nproc <= 1024 or not 0 <= port <= 65534:
        raise InputError(f"{nproc} processes, port {port}", op="launch",
                         valid="1 to 1024 processes; a port of 1 to 65534 (fusionc also "
                               "listens on port + 1), or 0 for a free one")
    port = port or free_port()
    procs = []
    try:
        for r in range(nproc):
            procs.append(subprocess.Popen(cmd, env=rank_env(r, nproc, port),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, errors="replace", bufsize=1))
    except OSError as e:
        _stop(procs)
        raise InputError(f"cannot start {cmd[0]!r}: {e.strerror}", op="launch",
                         valid="an executable command, e.g. python3 script.py") from None
    old = signal.signal(signal.SIGTERM, _terminated)
    try:
        return _supervise(procs, timeout)
    finally:   # Ctrl-C, SIGTERM or an error here: no rank is left spinning on a GPU
        _stop(procs)
        signal.signal(signal.SIGTERM, old)


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _supervise(procs, timeout: float | None) -> int:
    pumps = [threading.Thread(target=_pump, args=(r, p), daemon=True)
             for r, p in enumerate(procs)]
    for t in pumps:
        t.start()
    status, start = 0, time.monotonic()
    while [p.poll() for p in procs].count(None):
        failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
        late = timeout is not None and time.monotonic() - start > timeout
        if failed or late:
            status = failed[0] if failed else 124
            break
        time.sleep(0.05)
    _stop(procs)
    for t in pumps:
        t.join(timeout=5)
    for r, p in enumerate(procs):
        if p.returncode and p.returncode < 0 and status in (0, p.returncode):
            print(f"fusionc launch: rank {r} was killed by signal {-p.returncode}",
                  file=sys.stderr)
            status = 128 - p.returncode
    return status or next((p.returncode for p in procs if p.returncode), 0)


def _pump(rank: int, p: subprocess.Popen) -> None:
    for line in p.stdout:
        sys.stdout.write(f"[rank {rank}] {line}")
        sys.stdout.flush()
