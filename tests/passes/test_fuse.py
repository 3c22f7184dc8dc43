"""fuse: independent launches of cluster kernels (attention blocks) merge into one kernel;
dependent ones keep their boundary."""
import numpy as np

import fusionc as fc
from filecheck import filecheck
from fusionc.interp import interpret
from fusionc.ir import print_module
from fusionc.passes import run_pipeline
from fusionc.sim import simulate
from tests.passes.graphs import inputs, rel_err

H, HEADS, D, S = 64, 2, 32, 16
QKV = 3 * HEADS * D
CACHE = fc.f16["B", S, HEADS, D]


def _attn(x, norm, w_qkv, w_o, kc, vc, pos, lens, residual=False):
    """An attention block (cluster kernels: lowering v1's remaining blocks); ``residual``: the
    normalized h as the residual (from inside the block)."""
    h = fc.rms_norm(x, norm, 1e-5)
    q, k, v = (fc.split_heads(t, HEADS) for t in fc.split(fc.linear(h, w_qkv), [HEADS * D] * 3))
    q, k = fc.rope(q, pos, 1e4), fc.rope(k, pos, 1e4)
    kc, vc = fc.kv_cache_append(kc, vc, k, v, pos)
    o = fc.decode_attention(q, kc, vc, lens, D ** -0.5)
    return (h if residual else x) + fc.linear(fc.merge_heads(o), w_o), kc, vc


@fc.graph
def two_blocks(x: fc.f16["B", H], n1: fc.f16[H], q1: fc.f16[QKV, H], o1: fc.f16[H, HEADS * D],
               k1: CACHE, v1: CACHE, n2: fc.f16[H], q2: fc.f16[QKV, H],
               o2: fc.f16[H, HEADS * D], k2: CACHE, v2: CACHE, positions: fc.i32["B"],
               seq_lens: fc.i32["B"]):
    a = _attn(x, n1, q1, o1, k1, v1, positions, seq_lens)
    b = _attn(x, n2, q2, o2, k2, v2, positions, seq_lens)   # both read x only: independent
    return a + b


@fc.graph
def chained(x: fc.f16["B", H], n1: fc.f16[H], q1: fc.f16[QKV, H], o1: fc.f16[H, HEADS * D],
            k1: CACHE, v1: CACHE, n2: fc.f16[H], q2: fc.f16[QKV, H], o2: fc.f16[H, HEADS * D],
            k2: CACHE, v2: CACHE, positions: fc.i32["B"], seq_lens: fc.i32["B"]):
    y, ka, va = _attn(x, n1, q1, o1, k1, v1, positions, seq_lens)
    return (y, ka, va) + _attn(y, n2, q2, o2, k2, v2, positions, seq_lens)  # reads y


def _check(module, pipeline):
    low = run_pipeline(module, pipeline)
    g = module.graphs[0]
    args = inputs(g, 3, [1, 1, 1], np.random.default_rng(0))
    for a, r in zip(simulate(low, args), interpret(g, args)):
        assert rel_err(a, r) <= 1e-2
    return print_module(low)


def test_independent_launches_merge():
    text = _check(two_blocks, "partition-cluster{size=2,scheme=splitn},fuse")
    filecheck(text, """
        CHECK: kernel @two_blocks_k0_two_blocks_k1
        CHECK: graph @two_blocks
        CHECK-NEXT: launch({{.*}}) {kernel = @two_blocks_k0_two_blocks_k1}
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
    def odd(x: fc.f16["B", H], n1: fc.f16[H], q1: fc.f16[QKV, H], o1: fc.f16[H, HEADS * D],
            k1: CACHE, v1: CACHE, positions: fc.i32["B"], seq_lens: fc.i32["B"]):
        return _attn(x, n1, q1, o1, k1, v1, positions, seq_lens, residual=True)

    with pytest.raises(LoweringError, match="needs %.* from inside itself"):
        run_pipeline(odd, "partition-cluster{size=2}")
