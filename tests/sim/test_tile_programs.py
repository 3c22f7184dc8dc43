"""Random small tile programs (loads, GEMV partial products, collectives) give what the
equivalent graph-IR computation gives, and print/parse back exactly."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fusionc.interp import interpret
from fusionc.ir import parse_module, print_module
from fusionc.sim import simulate_kernel
from tests.sim.programs import splitk_gemv

LINEAR = """
graph @linear(%x: {dt}[B, {k}], %w: {dt}[{n}, {k}]) {{
  %y = linear(%x, %w) : {dt}[B, {n}]
  return %y
}}
"""


@settings(max_examples=40, deadline=None)
@given(size=st.sampled_from([1, 2, 4, 8, 16]), grid=st.integers(1, 3),
       k_tile=st.sampled_from([1, 3, 8, 16]), n_tile=st.sampled_from([16, 32]),
       batch=st.integers(1, 8), dtype=st.sampled_from(["f16", "bf16", "f32"]),
       scheme=st.sampled_from(["splitk", "gather"]), seed=st.integers(0, 2**16))
def test_gemv_programs_match_linear(size, grid, k_tile, n_tile, batch, dtype, scheme, seed):
    if scheme == "gather" and n_tile % size:
        n_tile = size * 2
    text = splitk_gemv(size, grid, k_tile, n_tile, dtype, scheme=scheme)
    m = parse_module(text)
    assert parse_module(print_module(m)) == m
    k, n = size * k_tile, grid * n_tile
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((batch, k)), rng.standard_normal((n, k)) / np.sqrt(k)
    out = simulate_kernel(m.graphs[0], {"x": x, "w": w, "y": np.full((batch, n), np.nan)})["y"]
    (ref,) = interpret(parse_module(LINEAR.format(dt=dtype, k=k, n=n)), {"x": x, "w": w})
    ref = np.asarray(ref, np.float64)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err <= {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2}[dtype]
