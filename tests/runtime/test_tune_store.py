"""Autotuning store: choices are stored per (graph, GPU, fusionc version) and fusionc.compile
reuses them without searching; the cost model decides when nothing is stored (CPU)."""
import pytest

import fusionc
from fusionc.tune import lookup, record
from fusionc.tune.store import DEFAULT_GPU, graph_key
from tests.passes.graphs import example


@pytest.fixture
def tmp_store(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSIONC_CACHE_DIR", str(tmp_path))
    return tmp_path


def _mlp():
    return example("llama2_7b", hidden=256, heads=2, head_dim=128, intermediate=512)["mlp"]


def test_store_round_trip_and_keys(tmp_store):
    g = _mlp()
    assert lookup(g, 4, 4096, DEFAULT_GPU) is None
    record(g, 4, 4096, {"cluster": 8, "scheme": "splitn", "gemv_unroll": 16}, DEFAULT_GPU)
    assert lookup(g, 4, 4096, DEFAULT_GPU)["cluster"] == 8
    assert lookup(g, 4, 3000, DEFAULT_GPU)["cluster"] == 8       # same KV bucket (4096)
    assert lookup(g, 4, 8192, DEFAULT_GPU) is None               # another KV bucket
    assert lookup(g, 8, 4096, DEFAULT_GPU) is None               # another batch bucket
    assert lookup(g, 4, 4096, "NVIDIA H100") is None             # another GPU
    assert graph_key(g, 4, 4096) != graph_key(
        example("llama2_7b", hidden=512, heads=2, head_dim=128, intermediate=512)["mlp"], 4, 4096)
    assert (tmp_store / "autotune.json").exists()


def test_compile_uses_the_stored_choice(tmp_store):
    g = _mlp()
    default = fusionc.compile(g, max_batch=4, lowering="v1")
    c0 = next(iter(default.kernels.values())).source.cluster
    choice = 2 if c0 != 2 else 4
    record(g, 4, 4096, {"cluster": choice, "scheme": "splitn", "gemv_unroll": 8}, DEFAULT_GPU)
    tuned = fusionc.compile(g, max_batch=4, lowering="v1")
    assert next(iter(tuned.kernels.values())).source.cluster == choice
    explicit = fusionc.compile(g, max_batch=4, cluster=c0, lowering="v1")  # explicit options win
    assert next(iter(explicit.kernels.values())).source.cluster == c0
