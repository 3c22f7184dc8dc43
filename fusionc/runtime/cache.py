"""On-disk cache of compiled cubins, keyed by everything that determines the binary.

Key: SHA-256 of (source, arch, NVRTC options, NVRTC version, fusionc version) — computable
without a GPU, so cubins built on a CPU machine can be carried to a GPU machine.
Folder: ``$FUSIONC_CACHE_DIR`` if set (``off`` disables caching), else the user cache folder
(``platformdirs``: ``$XDG_CACHE_HOME/fusionc``, by default ``~/.cache/fusionc`` on Linux).
Least recently used entries are evicted beyond ``$FUSIONC_CACHE_MAX_MB``
(:mod:`fusionc.runtime.cache_evict`; ``fusionc cache info`` / ``fusionc cache clear``).
An entry is ``<key>.cubin`` plus ``<key>.json`` (ptxas log, and the SHA-256 of cubin and log).
Files are written to ``*.tmp`` names and renamed into place, so several processes filling an
empty cache at once never read a partial file; an entry that fails its checksum, does not parse
or has fields of the wrong type is compiled again and overwritten.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import tempfile

from fusionc.runtime import cache_evict
from fusionc.runtime.nvrtc import CompileResult, compile_cubin, nvrtc_version, parse_ptxas_log


def cache_dir() -> pathlib.Path | None:
    """The cache folder, or None when caching is off."""
    env = os.environ.get("FUSIONC_CACHE_DIR")
    if env is not None and env.strip().lower() in ("", "0", "off", "none"):
        return None
    if env:
        return pathlib.Path(env)
    import platformdirs
    return pathlib.Path(platformdirs.user_cache_dir("fusionc", appauthor=False))


def cache_key(source: str, arch: str = "sm_90a", options: tuple[str, ...] = ()) -> str:
    """Hex digest identifying one compilation (NVRTC and fusionc versions included)."""
    import fusionc
    from fusionc.runtime.nvrtc import DEFAULT_OPTIONS
    blob = json.dumps([source, arch, list(DEFAULT_OPTIONS) + list(options),
                       list(nvrtc_version()), fusionc.__version__])
    return hashlib.sha256(blob.encode()).hexdigest()


def _digest(cubin: bytes, log: str) -> str:
    """The checksum of an entry: the cubin and the ptxas log (its registers and spills)."""
    return hashlib.sha256(cubin + b"\0" + log.encode()).hexdigest()


def _load(d: pathlib.Path, key: str, options) -> CompileResult | None:
    """The entry ``key``, or None (a miss) when it is absent, torn, fails its checksum or has
    fields of the wrong type."""
    try:
        meta = json.loads((d / f"{key}.json").read_text())
        cubin = (d / f"{key}.cubin").read_bytes()
        log, opts = meta["log"], meta.get("options", list(options))
        if not isinstance(log, str) or not isinstance(opts, list) or \
                not all(isinstance(o, str) for o in opts) or _digest(cubin, log) != meta["sha256"]:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return CompileResult(cubin=cubin, log=log, kernels=parse_ptxas_log(log), options=tuple(opts))


def _write(path: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def compile_cached(source: str, arch: str = "sm_90a", options: tuple[str, ...] = (),
                   name: str = "kernel.cu") -> tuple[CompileResult, bool]:
    """``compile_cubin`` through the cache: (result, whether it was a cache hit).

    Raises NVRTCError (a CompileError) when NVRTC fails; an unwritable cache is skipped.
    """
    d = cache_dir()
    key = cache_key(source, arch, options)
    if d is not None:
        hit = _load(d, key, options)
        if hit is not None:
            cache_evict.touch(d, key)
            return hit, True
    result = compile_cubin(source, name=name, arch=arch, options=options)
    if d is not None:
        try:
            d.mkdir(parents=True, exist_ok=True)
            _write(d / f"{key}.cubin", result.cubin)
            meta = {"log": result.log, "sha256": _digest(result.cubin, result.log),
                    "options": list(result.options), "arch": arch}
            _write(d / f"{key}.json", json.dumps(meta).encode())
            cache_evict.evict(d, keep=key)
        except OSError:
            pass
    return result, False
