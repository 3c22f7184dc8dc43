"""Autotuning store: choices are stored per (graph, GPU, fusionc version) and fusionc.compile
reuses them without searching; the cost table decides when nothing is stored (CPU)."""
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
    record(g, 4, 4096, {"path": "wide", "chain": True}, DEFAULT_GPU)
    assert lookup(g, 4, 4096, DEFAULT_GPU)["path"] == "wide"
    assert lookup(g, 4, 3000, DEFAULT_GPU)["path"] == "wide"     # same KV bucket (4096)
    assert lookup(g, 4, 8192, DEFAULT_GPU) is None               # another KV bucket
    assert lookup(g, 8, 4096, DEFAULT_GPU) is None               # another batch bucket
    assert lookup(g, 4, 4096, "NVIDIA H100") is None             # another GPU
    assert graph_key(g, 4, 4096) != graph_key(
        example("llama2_7b", hidden=512, heads=2, head_dim=128, intermediate=512)["mlp"], 4, 4096)
    assert (tmp_store / "autotune.json").exists()


def test_an_entry_of_the_removed_lowering_v1_is_never_looked_up(tmp_store):
    """v1's entries (cluster, scheme, gemv_unroll under keys without a lowering) stay in the
    file but are not v2's keys."""
    import hashlib
    import json
    from fusionc.ir.printer import print_graph
    g = _mlp()
    old = hashlib.sha256(f"{print_graph(g)}|max_batch=4|kv=4096".encode()).hexdigest()
    tmp_store.joinpath("autotune.json").write_text(json.dumps(
        {old: {DEFAULT_GPU: {fusionc.__version__: {"cluster": 2, "scheme": "splitn",
                                                   "gemv_unroll": 8}}}}))
    assert graph_key(g, 4, 4096) != old and lookup(g, 4, 4096, DEFAULT_GPU) is None
    assert fusionc.compile(g, max_batch=4).kernels   # the cost table: fused


def test_v2_candidates_by_graph_and_batch():
    from fusionc.tune.search import V2Choice, candidates
    g = _mlp()
    assert [c.describe() for c in candidates(g, 4)] == [
        "fused", "fused chained", "wide chained", "library"]
    assert candidates(g, 200) == [V2Choice("library", False)]   # past the fused bucket
    f32 = example("graphs_v2", hidden=256, inter=200, dtype="f32")["mlp"]
    assert "wide chained" not in [c.describe() for c in candidates(f32, 4)]


def test_a_stored_choice_decides_the_pipeline(tmp_store):
    """A stored choice decides fusionc.compile's pipeline (here the library path at 4 rows,
    where the cost table fuses)."""
    g = _mlp()
    assert fusionc.compile(g, max_batch=4).kernels   # the cost table: fused
    record(g, 4, 4096, {"path": "library", "chain": False, "us": 1.0}, DEFAULT_GPU)
    assert lookup(g, 4, 4096, DEFAULT_GPU)["path"] == "library"
    tuned = fusionc.compile(g, max_batch=4)
    assert not tuned.kernels and tuned.host.body[0].name != "launch"
    record(g, 4, 4096, {"path": "wide", "chain": True}, DEFAULT_GPU)
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
    best, results = autotune(_mlp(), 4, 4096, progress=False)
    assert best.describe() == "wide chained" and len(results) == 4
    assert lookup(_mlp(), 4, 4096) == {"path": "wide", "chain": True, "us": 5.0,
                                      "candidates": 4}


@pytest.mark.parametrize("rows", [0, -1, 2.5, True, None, "8"])
def test_v2_path_refuses_a_batch_that_is_no_positive_int(rows):
    from fusionc.cost.h200 import H200
    from fusionc.errors import InputError
    with pytest.raises(InputError, match="v2_path"):
        H200.v2_path(rows)
