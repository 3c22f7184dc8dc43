"""The autotuning store: ``autotune.json`` in the cubin cache folder.

Entries are keyed by the SHA-256 of the graph's IR text with the batch bucket, KV-length
bucket and lowering (v2), then by GPU name, then by fusionc version; each holds the chosen
path and chaining with the measured time. Written atomically (temporary file + rename).
Entries of the removed lowering v1 (keys without a lowering) are never looked up.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import tempfile

import fusionc
from fusionc.ir.nodes import Graph
from fusionc.ir.printer import print_graph

DEFAULT_GPU = "NVIDIA H200"  # the target when no GPU is present (compiling on a CPU machine)


def store_path() -> pathlib.Path:
    """The autotuning store file, beside the cubin cache."""
    from fusionc.runtime.cache import cache_dir
    return pathlib.Path(cache_dir() or (pathlib.Path.home() / ".cache" / "fusionc")) / \
        "autotune.json"


def graph_key(g: Graph, max_batch: int, kv_len: int) -> str:
    """Hex digest of the graph's IR with the batch bucket, the KV length rounded up to a power
    of two (the optimum moves with the KV length, slowly) and the lowering."""
    kv_bucket = 1 << max(0, int(kv_len) - 1).bit_length()
    text = f"{print_graph(g)}|max_batch={max_batch}|kv={kv_bucket}|lowering=v2"
    return hashlib.sha256(text.encode()).hexdigest()


def gpu_name() -> str:
    """The current GPU's name, or the default target without a GPU."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    except Exception:
        return DEFAULT_GPU


CHOICE_TEXT = ('{"path": "fused"|"wide"|"library"|"mixed", "chain": true|false, '
               '"fuse": true|false (optional)} under {graph key: {GPU: {version: ...}}}')


def _load() -> dict:
    try:
        data = json.loads(store_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        _ignored(f"it holds a {type(data).__name__}, not an object")
        return {}
    return data


def _ignored(why: str) -> None:
    import warnings
    warnings.warn(f"fusionc: ignoring {store_path()}: {why} (valid: {CHOICE_TEXT})",
                  RuntimeWarning, stacklevel=3)


def valid_choice(c) -> bool:
    """Whether ``c`` is a stored choice fusionc.compile can use (see :data:`CHOICE_TEXT`)."""
    from fusionc.tune.search import V2_PATHS
    return isinstance(c, dict) and c.get("path") in V2_PATHS and \
        isinstance(c.get("chain"), bool) and isinstance(c.get("fuse", False), bool)


def lookup(g: Graph, max_batch: int, kv_len: int, gpu: str | None = None) -> dict | None:
    """The stored choice for this graph on ``gpu`` (default: the current one) and this version,
    or None. A malformed entry (wrong JSON shape, a choice missing a field or out of range) is
    ignored with a RuntimeWarning: the cost table decides."""
    node = _load().get(graph_key(g, max_batch, kv_len))
    for key in (gpu or gpu_name(), fusionc.__version__):
        if node is None:
            return None
        if not isinstance(node, dict):
            _ignored(f"an entry is a {type(node).__name__}, not an object")
            return None
        node = node.get(key)
    if node is not None and not valid_choice(node):
        _ignored(f"the stored choice {json.dumps(node)[:120]} is malformed")
        return None
    return node


def record(g: Graph, max_batch: int, kv_len: int, choice: dict,
           gpu: str | None = None) -> None:
    """Store ``choice`` (a JSON-able dict) for this graph, GPU and version."""
    data = _load()
    node = data
    for k in (graph_key(g, max_batch, kv_len), gpu or gpu_name()):
        if not isinstance(node.get(k), dict):   # absent or malformed: replaced
            node[k] = {}
        node = node[k]
    node[fusionc.__version__] = choice
    path = store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="autotune", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
