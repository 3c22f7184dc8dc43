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
    """Lowering v1's choice (cluster size, scheme) of its cluster kernel: the attention block."""
    g = example("llama2_7b", hidden=256, heads=2, head_dim=128, intermediate=512)["attention"]
    default = fusionc.compile(g, max_batch=4, lowering="v1")
    c0 = next(iter(default.kernels.values())).source.cluster
    choice = 2 if c0 != 2 else 4
    record(g, 4, 4096, {"cluster": choice, "scheme": "splitn", "gemv_unroll": 8}, DEFAULT_GPU)
    tuned = fusionc.compile(g, max_batch=4, lowering="v1")
    assert next(iter(tuned.kernels.values())).source.cluster == choice
    explicit = fusionc.compile(g, max_batch=4, cluster=c0, lowering="v1")  # explicit options win
    assert next(iter(explicit.kernels.values())).source.cluster == c0


def test_v1_candidates_vary_only_where_a_cluster_kernel_is():
    from fusionc.tune.search import candidates
    assert len(candidates(_mlp(), 4, "v1")) == 1   # an MLP lowers on v2's kernels under v1
    assert len(candidates(None, 4, "v1")) == 20


def test_v2_candidates_by_graph_and_batch():
    from fusionc.tune.search import V2Choice, candidates
    g = _mlp()
    assert [c.describe() for c in candidates(g, 4, "v2")] == [
        "fused", "fused chained", "wide chained", "library"]
    assert candidates(g, 200, "v2") == [V2Choice("library", False)]   # past the fused bucket
    f32 = example("graphs_v2", hidden=256, inter=200, dtype="f32")["mlp"]
    assert "wide chained" not in [c.describe() for c in candidates(f32, 4, "v2")]


def test_v2_choices_are_stored_apart_from_v1_and_used(tmp_store):
    """A stored v2 choice decides fusionc.compile's v2 pipeline (here the library path at 4
    rows, where the cost table fuses); v1's entry for the same graph is kept apart."""
    g = _mlp()
    assert fusionc.compile(g, max_batch=4).kernels   # the cost table: fused
    record(g, 4, 4096, {"path": "library", "chain": False, "us": 1.0}, DEFAULT_GPU,
           lowering="v2")
    record(g, 4, 4096, {"cluster": 2, "scheme": "splitn", "gemv_unroll": 8}, DEFAULT_GPU)
    assert lookup(g, 4, 4096, DEFAULT_GPU, lowering="v2")["path"] == "library"
    assert lookup(g, 4, 4096, DEFAULT_GPU)["cluster"] == 2
    tuned = fusionc.compile(g, max_batch=4)
    assert not tuned.kernels and tuned.host.body[0].name != "launch"
    record(g, 4, 4096, {"path": "wide", "chain": True}, DEFAULT_GPU, lowering="v2")
    wide = fusionc.compile(g, max_batch=4)
    assert "rows = 128" in fusionc.ir.print_module(wide.module)


def test_v2_search_stores_the_fastest(tmp_store, monkeypatch):
    """The v2 search times each candidate (faked here: no GPU) and stores the fastest."""
    from fusionc.runtime import arrays
    from fusionc.tune import autotune, search
    monkeypatch.setattr(arrays, "require_gpu", lambda: None)
    monkeypatch.setattr(search, "_buffer_sets", lambda *a: [{}])
    monkeypatch.setattr(search, "_outputs", lambda *a: {})
    fake = {0: 9.0, 1: 7.0, 2: 5.0, 3: 8.0}   # the third candidate (wide chained) wins
    order = iter(range(4))
    monkeypatch.setattr(search, "_time", lambda *a: fake[next(order)])
    best, results = autotune(_mlp(), 4, 4096, progress=False, lowering="v2")
    assert best.describe() == "wide chained" and len(results) == 4
    assert lookup(_mlp(), 4, 4096, lowering="v2") == {"path": "wide", "chain": True,
                                                     "us": 5.0, "candidates": 4}


@pytest.mark.parametrize("rows", [0, -1, 2.5, True, None, "8"])
def test_v2_path_refuses_a_batch_that_is_no_positive_int(rows):
    from fusionc.cost.h200 import H200
    from fusionc.errors import InputError
    with pytest.raises(InputError, match="v2_path"):
        H200.v2_path(rows)
