"""Size limit, listing and clearing of the cubin cache (:mod:`fusionc.runtime.cache`).

An entry is the pair ``<key>.cubin`` + ``<key>.json`` (key: 64 hex digits); its last use is the
cubin's modification time, which a cache hit refreshes (:func:`touch`). After every write the
least recently used entries go until the cache is at most ``$FUSIONC_CACHE_MAX_MB`` megabytes
(default :data:`DEFAULT_MAX_MB`; ``0`` or ``none``: no limit). Other files in the folder (the
autotuning store ``autotune.json``) are never evicted.
"""
from __future__ import annotations

import os
import pathlib
import re
import time
from dataclasses import dataclass

from fusionc.errors import InputError

DEFAULT_MAX_MB = 2048
_KEY = re.compile(r"[0-9a-f]{64}\Z")
_STALE_TMP_S = 3600   # a *.tmp file this old is left over from a killed writer


@dataclass(frozen=True)
class Entry:
    """One cached compilation: its key, bytes on disk (cubin + metadata), last use (epoch s)."""

    key: str
    size: int
    used: float


def max_bytes() -> int | None:
    """The size limit from ``$FUSIONC_CACHE_MAX_MB`` in bytes (None: no limit)."""
    raw = os.environ.get("FUSIONC_CACHE_MAX_MB", str(DEFAULT_MAX_MB)).strip().lower()
    if raw in ("0", "none", "off", "unlimited"):
        return None
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not mb > 0:
        raise InputError(f"FUSIONC_CACHE_MAX_MB = {raw!r}",
                         valid="a size in megabytes > 0, or 0 / none for no limit")
    return int(mb * 2**20)


def entries(d: pathlib.Path) -> list[Entry]:
    """The complete entries of cache folder ``d``, least recently used first."""
    sizes: dict[str, list] = {}
    try:
        it = list(os.scandir(d))
    except OSError:
        return []
    for f in it:
        stem, _, ext = f.name.rpartition(".")
        if ext in ("cubin", "json") and _KEY.match(stem):
            try:
                st = f.stat()
            except OSError:
                continue
            e = sizes.setdefault(stem, [0, None])
            e[0] += st.st_size
            if ext == "cubin":
                e[1] = st.st_mtime
    return sorted((Entry(k, s, t) for k, (s, t) in sizes.items() if t is not None),
                  key=lambda e: e.used)


def touch(d: pathlib.Path, key: str) -> None:
    """Mark entry ``key`` as just used (a cache hit)."""
    try:
        os.utime(d / f"{key}.cubin")
    except OSError:
        pass


def remove(d: pathlib.Path, key: str) -> None:
    """Delete entry ``key`` (metadata first: a reader then misses instead of half-reading)."""
    for ext in ("json", "cubin"):
        (d / f"{key}.{ext}").unlink(missing_ok=True)


def evict(d: pathlib.Path, limit: int | None = None, keep: str | None = None) -> int:
    """Remove least recently used entries of ``d`` until it holds at most ``limit`` bytes
    (default :func:`max_bytes`), never entry ``keep`` (the one just written); returns the
    number removed."""
    limit = max_bytes() if limit is None else limit
    if limit is None:
        return 0
    es = entries(d)
    total, removed = sum(e.size for e in es), 0
    for e in es:
        if total <= limit:
            break
        if e.key != keep:
            remove(d, e.key)
            total, removed = total - e.size, removed + 1
    return removed


def clear(d: pathlib.Path) -> int:
    """Remove every entry of ``d`` and stale temporary files; returns the entries removed."""
    es = entries(d)
    for e in es:
        remove(d, e.key)
    now = time.time()
    for tmp in d.glob(".*.tmp") if d.is_dir() else ():
        try:
            if now - tmp.stat().st_mtime > _STALE_TMP_S:
                tmp.unlink()
        except OSError:
            pass
    return len(es)
