"""Autotuning: measure compile-time choices (cluster size, scheme, gemv loads in flight) on the
GPU and store the fastest per (graph, GPU, fusionc version); ``fusionc.compile`` reuses stored
choices without searching again and falls back to the cost model when nothing is stored."""
from fusionc.tune.search import Choice, autotune
from fusionc.tune.store import lookup, record

__all__ = ["Choice", "autotune", "lookup", "record"]
