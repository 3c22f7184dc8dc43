"""fuse: independent launches merge into one kernel; dependent ones keep their boundary."""
import numpy as np

import fusionc as fc
from filecheck import filecheck
from fusionc.interp import interpret
from fusionc.ir import print_module
from fusionc.passes import run_pipeline
from fusionc.sim import simulate
from tests.passes.graphs import inputs, rel_err

H, I = 64, 128


def _mlp(x, norm, w_gu, w_down, tag):
    h = fc.rms_norm(x, norm, 1e-5, name=f"h{tag}")
    gate, up = fc.split(fc.linear(h, w_gu), [I, I])
    return x + fc.linear(fc.silu_mul(gate, up), w_down)


@fc.graph
def two_mlps(x: fc.f16["B", H], n1: fc.f16[H], g1: fc.f16[2 * I, H], d1: fc.f16[H, I],
             n2: fc.f16[H], g2: fc.f16[2 * I, H], d2: fc.f16[H, I]):
    return _mlp(x, n1, g1, d1, 1), _mlp(x, n2, g2, d2, 2)  # both read x only: independent


@fc.graph
def chained(x: fc.f16["B", H], n1: fc.f16[H], g1: fc.f16[2 * I, H], d1: fc.f16[H, I],
            n2: fc.f16[H], g2: fc.f16[2 * I, H], d2: fc.f16[H, I]):
    return _mlp(_mlp(x, n1, g1, d1, 1), n2, g2, d2, 2)  # the second reads the first's output


def _check(module, pipeline):
    low = run_pipeline(module, pipeline)
    g = module.graphs[0]
    args = inputs(g, 3, [1, 1, 1], np.random.default_rng(0))
    for a, r in zip(simulate(low, args), interpret(g, args)):
        assert rel_err(a, r) <= 1e-2
    return print_module(low)


def test_independent_launches_merge():
    text = _check(two_mlps, "partition-cluster{size=2,scheme=splitn},fuse")
    filecheck(text, """
        CHECK: kernel @two_mlps_k0_two_mlps_k1
        CHECK: graph @two_mlps
        CHECK-NEXT: launch({{.*}}) {kernel = @two_mlps_k0_two_mlps_k1}
        CHECK-NOT: launch
    """)


def test_dependent_launches_keep_their_boundary():
    text = _check(chained, "partition-cluster{size=2,scheme=splitn},fuse")
    filecheck(text, """
        CHECK: graph @chained
        CHECK-NEXT: launch({{.*}}) {kernel = @chained_k0}
        CHECK-NEXT: launch({{.*}}) {kernel = @chained_k1}
    """)


def test_residual_from_inside_the_block_is_refused():
    import pytest
    from fusionc.errors import LoweringError

    @fc.graph
    def odd(x: fc.f16["B", H], n1: fc.f16[H], g1: fc.f16[2 * I, H], d1: fc.f16[H, I]):
        h = fc.rms_norm(x, n1, 1e-5)
        gate, up = fc.split(fc.linear(h, g1), [I, I])
        return h + fc.linear(fc.silu_mul(gate, up), d1)  # residual = the normalized h

    with pytest.raises(LoweringError, match="needs %.* from inside itself"):
        run_pipeline(odd, "partition-cluster{size=2}")
