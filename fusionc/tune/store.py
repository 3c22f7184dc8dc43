"""The autotuning store: ``autotune.json`` in the cubin cache folder.

Entries are keyed by the SHA-256 of the graph's IR text with the batch bucket and KV-length
bucket (and the lowering, for v2), then by GPU name, then by fusionc version; each holds the
chosen cluster size, scheme and gemv loads in flight (v1) or path and chaining (v2) with the
measured time. Written atomically (temporary file + rename).
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


def graph_key(g: Graph, max_batch: int, kv_len: int, lowering: str = "v1") -> str:
    """Hex digest of the graph's IR with the batch bucket and the KV length rounded up to a
    power of two (the optimum moves with the KV length, slowly), and the lowering unless v1."""
    kv_bucket = 1 << max(0, int(kv_len) - 1).bit_length()
    text = f"{print_graph(g)}|max_batch={max_batch}|kv={kv_bucket}"
    text += "" if lowering == "v1" else f"|lowering={lowering}"
    return hashlib.sha256(text.encode()).hexdigest()


def gpu_name() -> str:
    """The current GPU's name, or the default target without a GPU."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    except Exception:
        return DEFAULT_GPU


CLUSTERS, SCHEMES, UNROLL = (1, 2, 4, 8, 16), ("splitk", "splitn"), range(0, 33)
CHOICE_TEXT = ('{"cluster": 1|2|4|8|16, "scheme": "splitk"|"splitn", "gemv_unroll": 0..32} '
               '(v1) or {"path": "fused"|"wide"|"library"|"mixed", "chain": true|false} (v2) '
               "under {graph key: {GPU: {version: ...}}}")


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


def valid_choice(c, lowering: str = "v1") -> bool:
    """Whether ``c`` is a stored choice of ``lowering`` fusionc.compile can use (see
    :data:`CHOICE_TEXT`)."""
    from fusionc.tune.search import V2_PATHS

    def int_in(v, allowed):
        return isinstance(v, int) and not isinstance(v, bool) and v in allowed
    if lowering == "v2":
        return isinstance(c, dict) and c.get("path") in V2_PATHS and \
            isinstance(c.get("chain"), bool)
    return isinstance(c, dict) and int_in(c.get("cluster"), CLUSTERS) and \
        c.get("scheme") in SCHEMES and int_in(c.get("gemv_unroll"), UNROLL)


def lookup(g: Graph, max_batch: int, kv_len: int, gpu: str | None = None,
           lowering: str = "v1") -> dict | None:
    """The stored choice of ``lowering`` for this graph on ``gpu`` (default: the current one)
    and this version, or None. A malformed entry (wrong JSON shape, a choice missing a field or
    out of range) is ignored with a RuntimeWarning: the cost model decides."""
    node = _load().get(graph_key(g, max_batch, kv_len, lowering))
    for key in (gpu or gpu_name(), fusionc.__version__):
        if node is None:
            return None
        if not isinstance(node, dict):
            _ignored(f"an entry is a {type(node).__name__}, not an object")
            return None
        node = node.get(key)
    if node is not None and not valid_choice(node, lowering):
        _ignored(f"the stored choice {json.dumps(node)[:120]} is malformed")
        return None
    return node


def record(g: Graph, max_batch: int, kv_len: int, choice: dict, gpu: str | None = None,
           lowering: str = "v1") -> None:
    """Store ``choice`` (a JSON-able dict) of ``lowering`` for this graph, GPU and version."""
    data = _load()
    node = data
    for k in (graph_key(g, max_batch, kv_len, lowering), gpu or gpu_name()):
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
