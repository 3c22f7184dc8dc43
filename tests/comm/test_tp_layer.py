"""The TP layer graph (examples/tp2_llama_layer.py) on 2 and 4 simulated ranks with sharded
weights equals the single-GPU attention + MLP graphs; the pipeline turns its collectives into
all_reduce_add_rms_norm and all_reduce_add between the two fused kernels."""
import numpy as np
import pytest

import fusionc as fc
from fusionc.commands.compile import random_inputs
from fusionc.ir import print_module
from fusionc.models.blocks import attention_block, mlp_block, tp_layer_block
from fusionc.models.tp import shard_layer
from fusionc.passes import run_pipeline
from tests.filecheck import filecheck

SIZES = dict(hidden=128, heads=4, kv_heads=4, head_dim=32, intermediate=256)


def _full(rng, batch, sizes):
    common = dict(max_seq=16, eps=1e-5, theta=10000.0, dtype="f16")
    att = attention_block(hidden=sizes["hidden"], heads=sizes["heads"],
                          kv_heads=sizes["kv_heads"], head_dim=sizes["head_dim"], **common)
    mlp = mlp_block(hidden=sizes["hidden"], intermediate=sizes["intermediate"], eps=1e-5,
                    dtype="f16")
    return att, mlp, random_inputs(att.graphs[0], batch, rng, max_len=16), \
        random_inputs(mlp.graphs[0], batch, rng)


@pytest.mark.parametrize("tp,kv_heads", [(2, 4), (2, 2), (4, 4)])
@pytest.mark.parametrize("batch", [1, 3])
def test_sharded_layer_equals_single_gpu_layer(tp, kv_heads, batch):
    sizes = dict(SIZES, kv_heads=kv_heads)
    rng = np.random.default_rng(tp * 10 + batch)
    att, mlp, ai, mi = _full(rng, batch, sizes)
    h, kc, vc = fc.interpret(att, ai, precise=True)   # float64, no rounding
    (want,) = fc.interpret(mlp, dict(mi, x=h), precise=True)
    layer = tp_layer_block(tp=tp, max_seq=16, eps=1e-5, theta=10000.0, dtype="f16", **sizes)
    ins = [shard_layer(ai, mi, r, tp, **{k: v for k, v in sizes.items() if k != "hidden"})
           for r in range(tp)]
    fused = run_pipeline(layer, "fuse-allreduce-norm")
    hkv = kv_heads // tp
    for g in (layer, fused):
        outs = fc.interpret(g, ins, precise=True)
        for r, (out, kr, vr) in enumerate(outs):
            # the reference rounds h to f16 where it enters @mlp as an input: ~5e-4
            assert np.linalg.norm(out - want) / np.linalg.norm(want) < 3e-3
            assert np.array_equal(kr, kc[:, :, r * hkv:(r + 1) * hkv], equal_nan=True)
            assert np.array_equal(vr, vc[:, :, r * hkv:(r + 1) * hkv], equal_nan=True)


V2_SIZES = dict(hidden=256, heads=8, kv_heads=4, head_dim=64, intermediate=512)


@pytest.mark.parametrize("tp,kv_heads,batch", [(2, 4, 1), (2, 2, 3), (4, 4, 2)])
@pytest.mark.parametrize("fused", [False, True])
def test_on_v2_the_collectives_sit_between_the_streamed_kernels(tp, kv_heads, batch, fused):
    """The default lowering of a TP layer: QKV (RMSNorm prologue), the attention units, O
    (``fused``: all in one kernel, ``partition-units{attention_o}``), then all_reduce_add_rms_norm, gate/up (no prologue: the collective normed),
    down, then all_reduce_add; over simulated ranks the kernels compute what the interpreter
    does."""
    from fusionc.interp.numerics import defined_relative_error
    from fusionc.runtime.pipelines import v2_default_pipeline
    sizes = dict(V2_SIZES, kv_heads=kv_heads)
    layer = tp_layer_block(tp=tp, max_seq=16, eps=1e-5, theta=10000.0, dtype="f16", **sizes)
    g = layer.graphs[0]
    pipe = v2_default_pipeline(g, batch)
    low = run_pipeline(layer, pipe.replace("}", ", attention_o=true}", 1) if fused else pipe)
    names = [op.name for op in low["layer"].body]
    assert names == ["launch"] * (1 if fused else 3) + ["all_reduce_add_rms_norm"] + \
        ["launch"] * 2 + ["all_reduce_add"]
    rng = np.random.default_rng(tp + batch)
    att, mlp, ai, mi = _full(rng, batch, sizes)
    ins = [shard_layer(ai, mi, r, tp, **{k: v for k, v in sizes.items() if k != "hidden"})
           for r in range(tp)]
    ref, out = fc.interpret(layer, ins), fc.simulate(low, ins)
    for r in range(tp):
        for a, b in zip(out[r], ref[r]):
            assert defined_relative_error(a, b) <= 1e-2


def test_sizes_not_divisible_by_tp_are_refused():
    with pytest.raises(ValueError, match="kv_heads = 2 is not a multiple of tp = 4"):
        tp_layer_block(tp=4, max_seq=16, eps=1e-5, theta=1e4, dtype="f16",
                       **dict(SIZES, kv_heads=2))


def test_fused_forms_refuse_a_residual_that_is_not_replicated():
    from fusionc.errors import InputError

    @fc.graph
    def g(p1: fc.f16["B", 8], p2: fc.f16["B", 8], w: fc.f16[8]):
        return fc.rms_norm(fc.all_reduce(p1, 2) + p2, w, 1e-5)
    rng = np.random.default_rng(0)
    ins = [{"p1": rng.standard_normal((4, 8)), "p2": rng.standard_normal((4, 8)),
            "w": np.ones(8)} for _ in range(2)]
    fc.interpret(g, ins)   # unfused: fine
    with pytest.raises(InputError, match="differs between the ranks"):
        fc.interpret(run_pipeline(g, "fuse-allreduce-norm"), ins)


def test_zero_tokens_and_several_ranks_in_the_simulator():
    from fusionc.errors import InputError
    @fc.graph
    def tail(x: fc.f16["B", 8], r: fc.f16["B", 8], w: fc.f16[8]):
        return fc.rms_norm(fc.all_reduce(x, 2) + r, w, 1e-5)
    none = {"x": np.zeros((0, 8)), "r": np.zeros((0, 8)), "w": np.ones(8)}
    fused = run_pipeline(tail, "fuse-allreduce-norm")
    assert fc.interpret(fused, [none, none])[1][0].shape == (0, 8)
    layer = tp_layer_block(tp=2, max_seq=16, eps=1e-5, theta=10000.0, dtype="f16", **SIZES)
    g = layer.graphs[0]
    ins = random_inputs(g, 1, np.random.default_rng(0))
    from fusionc.runtime.pipelines import v2_default_pipeline
    lowered = run_pipeline(layer, v2_default_pipeline(g, 1))
    with pytest.raises(InputError, match="no graph named"):
        fc.simulate(lowered, [ins, ins], graph="nope")
    with pytest.raises(InputError, match="non-empty list"):
        fc.simulate(lowered, [])
    two = random_inputs(g, 2, np.random.default_rng(0))
    with pytest.raises(InputError, match="sizes"):
        fc.simulate(lowered, [ins, two])


def test_the_sum_of_two_all_reduces_is_fused_once():
    @fc.graph
    def g(a: fc.f16["B", 8], m: fc.f16["B", 8], w: fc.f16[8]):
        return fc.rms_norm(fc.all_reduce(a, 2) + fc.all_reduce(m, 2), w, 1e-5)
    fused = run_pipeline(g, "fuse-allreduce-norm")
    rng = np.random.default_rng(1)
    ins = [{"a": rng.standard_normal((3, 8)), "m": rng.standard_normal((3, 8)),
            "w": np.ones(8)} for _ in range(2)]
    assert np.array_equal(fc.interpret(g, ins)[0][0], fc.interpret(fused, ins)[0][0])
