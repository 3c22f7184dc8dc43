"""Issue 26: a malformed autotuning store and a search with no candidate that fits give a
named error or are ignored with a warning, never AttributeError/KeyError/ValueError."""
import contextlib
import json

import pytest

import fusionc
from fusionc.errors import LoweringError
from fusionc.tune import lookup, record
from fusionc.tune.store import DEFAULT_GPU, graph_key
from tests.passes.graphs import example


@pytest.fixture
def tmp_store(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSIONC_CACHE_DIR", str(tmp_path))
    return tmp_path / "autotune.json"


def _mlp():
    return example("llama2_7b", hidden=256, heads=2, head_dim=128, intermediate=512)["mlp"]


def _shapes(key):
    v = fusionc.__version__
    good = {"path": "fused", "chain": False}
    return [[], {key: []}, {key: {DEFAULT_GPU: 3}}, {key: {DEFAULT_GPU: {v: "x"}}},
            {key: {DEFAULT_GPU: {v: {"chain": False}}}},
            {key: {DEFAULT_GPU: {v: {**good, "path": "cluster"}}}},
            {key: {DEFAULT_GPU: {v: {**good, "chain": 1}}}},
            {key: {DEFAULT_GPU: {v: {"cluster": 2, "scheme": "splitn", "gemv_unroll": 8}}}}]


@pytest.mark.parametrize("i", range(8))
def test_malformed_store_is_ignored_with_a_warning(tmp_store, i):
    g = _mlp()
    tmp_store.write_text(json.dumps(_shapes(graph_key(g, 4, 4096))[i]))
    with pytest.warns(RuntimeWarning, match="ignoring .*autotune.json"):
        assert lookup(g, 4, 4096, DEFAULT_GPU) is None
    with pytest.warns(RuntimeWarning):
        fn = fusionc.compile(g, max_batch=4)   # the cost table decides
    assert fn.kernels
    with pytest.warns(RuntimeWarning) if i == 0 else contextlib.nullcontext():
        record(g, 4, 4096, {"path": "library", "chain": False}, DEFAULT_GPU)
    assert lookup(g, 4, 4096, DEFAULT_GPU)["path"] == "library"


def test_no_candidate_fits(monkeypatch):
    from fusionc.runtime import arrays
    from fusionc.tune import autotune
    monkeypatch.setattr(arrays, "require_gpu", lambda: None)
    g = example("llama2_7b", hidden=256, heads=2, intermediate=512)["attention"]
    with pytest.raises(LoweringError, match="no candidate of the autotuning search compiles"):
        autotune(g, 100000, 4096, progress=False, store=False)
