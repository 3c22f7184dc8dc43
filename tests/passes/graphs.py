"""Decoder-stage graphs for pass tests, built with the examples' block functions, and random
inputs for them (fresh each call, NaN past every row's KV length)."""
from __future__ import annotations

import pathlib

import numpy as np

from fusionc.dsl.loader import load_file
from fusionc.interp.numerics import defined_relative_error

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def example(name: str, **sizes):
    """``examples/<name>.py``'s ``build(**sizes)``."""
    return load_file(str(EXAMPLES / f"{name}.py"), **sizes)


def inputs(graph, batch: int, lens: list[int], rng: np.random.Generator) -> dict:
    """Random inputs for an attention or MLP graph: weights scaled like trained ones."""
    out = {}
    for p in graph.params:
        shape = tuple(batch if isinstance(d, str) else d for d in p.type.shape)
        if p.name == "seq_lens":
            out[p.name] = np.array(lens, np.int32)
        elif p.name == "positions":
            out[p.name] = np.maximum(np.array(lens) - 1, 0).astype(np.int32)
        elif "cache" in p.name:
            a = rng.standard_normal(shape).astype(np.float32)
            for b, n in enumerate(lens):
                a[b, n:] = np.nan  # never read
            out[p.name] = a
        elif "norm" in p.name:
            out[p.name] = 1 + 0.2 * rng.standard_normal(shape)
        elif len(shape) >= 2 and p.name.startswith("w"):
            out[p.name] = rng.standard_normal(shape) / np.sqrt(shape[-1])
        else:
            out[p.name] = rng.standard_normal(shape)
    return out


def rel_err(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖ where ref is defined (cache tails hold NaN); NaN fails."""
    return defined_relative_error(out, ref)


def linear_graph(n, k, dtype="f16", bias=False):
    """Graph ``@lin``: y = x·Wᵀ (+ bias) for x ``[B, k]``, W ``[n, k]`` (design v2's linear)."""
    import fusionc as fc
    T = fc.dtype(dtype)
    if bias:
        return fc.graph(lambda x, w, b: fc.linear(x, w, b, name="y"), name="lin",
                        x=T["B", k], w=T[n, k], b=T[n])
    return fc.graph(lambda x, w: fc.linear(x, w, name="y"), name="lin", x=T["B", k], w=T[n, k])
