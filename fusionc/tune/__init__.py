"""Autotuning: measure lowering v2's paths (fused 64- or 128-row tiles, chained or not, an
attention block in one kernel or not, the library path, the mixed path) on the GPU and store the fastest per (graph, GPU, fusionc
version); ``fusionc.compile`` reuses stored choices without searching again and falls back to
the cost table when nothing is stored."""
from fusionc.tune.search import V2Choice, autotune
from fusionc.tune.store import lookup, record

__all__ = ["V2Choice", "autotune", "lookup", "record"]
