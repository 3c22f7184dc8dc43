"""Graph ops inside a kernel (reshape, rms_norm, rope, split, silu_mul, silu, add, mul, cast)
on the GPU against the simulator (which runs their interpreter rules) and the graph-IR
interpreter running the same ops as a graph."""
from __future__ import annotations

import numpy as np
import pytest

from fusionc.ir import parse_module
from fusionc.sim import simulate_kernel
from tests.codegen.programs import graph_ops_graph, graph_ops_kernel
from tests.gpu.common import kernel, record, rel

# rms_norm rows: 2 heads x max_batch 4 = 8 (the whole CTA per row) or 8 heads (32 rows: a warp
# per row)
CASES = [("f16", "neox", 32, 2), ("bf16", "gptj", 64, 2), ("f32", "neox", 64, 2),
         ("f16", "neox", 64, 8)]


def precompile():
    for dt, style, rot, heads in CASES:
        kernel(graph_ops_kernel(heads=heads, dtype=dt, style=style, rot=rot))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,style,rot,heads", CASES)
def test_graph_ops_match_simulator_and_interpreter(dtype, style, rot, heads):
    from fusionc.interp import interpret
    from fusionc.runtime.run import run_kernel
    k = kernel(graph_ops_kernel(heads=heads, dtype=dtype, style=style, rot=rot))
    g = parse_module(graph_ops_graph(heads=heads, dtype=dtype, style=style, rot=rot))
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((3, heads * 64)), rng.standard_normal(64)
    pos = np.array([0, 7, 100000], np.int32)
    args = {"xg": x, "wg": w, "pg": pos, "y": np.full((3, heads * 32), np.nan)}
    sim = simulate_kernel(k, args)["y"]
    want = interpret(g, {"x": x, "wn": w, "pos": pos})[0]
    got = run_kernel(k, args)["y"]
    e_sim, e = rel(got, sim), rel(got, want)
    record("graph ops", f"{dtype} rope {style} rotary {rot}, {heads} heads",
           f"vs sim {e_sim:.1e}, vs interpreter {e:.1e}")
    tol = 1e-4 if dtype == "f32" else 2e-2
    assert e_sim <= tol and e <= tol
