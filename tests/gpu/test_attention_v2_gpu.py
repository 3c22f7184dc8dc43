"""The attention block on lowering v2 (issue 22): the QKV projection and the output projection as
v2 linear kernels, the core (RoPE, QK-norm, KV append, split-KV attention) as attention units
over every SM. Each case against the float64 interpreter and the simulator on fresh random
inputs (NaN in the caches past each row's length, the output poisoned), with MHA, GQA 4:1 and
8:1, one KV head, Qwen3's QK-norm, GPT-J RoPE with a partial rotary dim, Llama 3.1 scaling,
head_dim 64 / 80 / 96 / 128 / 160 / 224 / 256, f32 (FMA: head_dim 64-192, query blocks), a group of 32 query heads
(query blocks), rows of length 0, 1, a chunk ± 1 and long rows, batch 1-64
(batch 256: test_attention_v2_edges_gpu); then 50 CUDA-graph replays with lengths that grow
each step."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import numpy as np
import pytest

import fusionc as fc
from fusionc.interp import interpret
from fusionc.models.blocks import attention_block
from fusionc.runtime.transfer import download, nan_bits, upload
from fusionc.sim import simulate
from tests.gpu.common import record
from tests.passes.graphs import inputs as random_inputs, rel_err

pytestmark = pytest.mark.gpu

# (name, block sizes, dtype, lens, max_batch)
CASES = [
    ("mha", dict(hidden=512, heads=4, kv_heads=4, head_dim=128, max_seq=2048), "f16",
     [2048], 1),
    ("gqa4", dict(hidden=512, heads=8, kv_heads=2, head_dim=128, max_seq=4096), "bf16",
     [1, 0, 63, 65, 64, 4096, 1000, 129], 8),
    ("gqa8-long", dict(hidden=512, heads=16, kv_heads=2, head_dim=128, max_seq=32768), "bf16",
     [32768, 5], 2),
    ("one-kv-head", dict(hidden=256, heads=8, kv_heads=1, head_dim=64, max_seq=3000), "f16",
     [3000, 1, 2999], 4),
    ("qk-norm", dict(hidden=384, heads=8, kv_heads=2, head_dim=128, max_seq=1024,
                     qk_norm=True), "bf16", [1024, 300, 0, 17], 4),
    ("llama31", dict(hidden=512, heads=8, kv_heads=2, head_dim=128, max_seq=512,
                     rope_scaling=(8.0, 1.0, 4.0, 8192.0), theta=500000.0), "f16",
     [512] * 3, 4),
    ("d80", dict(hidden=256, heads=4, kv_heads=2, head_dim=80, max_seq=700), "f16",
     [700, 3], 2),
    ("d96", dict(hidden=256, heads=6, kv_heads=2, head_dim=96, max_seq=700), "bf16",
     [1, 699], 2),
    ("d256", dict(hidden=256, heads=4, kv_heads=2, head_dim=256, max_seq=600), "f16",
     [600, 129], 2),
    ("d64-batch64", dict(hidden=256, heads=8, kv_heads=4, head_dim=64, max_seq=256), "f16",
     None, 64),
    ("batch5", dict(hidden=512, heads=8, kv_heads=2, head_dim=128, max_seq=1500), "bf16",
     [0, 1, 1500, 129, 127], 5),
    ("mqa32", dict(hidden=256, heads=32, kv_heads=1, head_dim=64, max_seq=2048), "f16",
     [2048, 0, 5, 700], 4),   # a group of 32: two query blocks per KV head
    ("g20", dict(hidden=256, heads=40, kv_heads=2, head_dim=64, max_seq=1000), "bf16",
     [1000, 1, 0], 4),        # a group of 20: a full block and one of 4 rows
    ("f32-gqa4", dict(hidden=256, heads=8, kv_heads=2, head_dim=128, max_seq=1024), "f32",
     [1024, 0, 1, 129], 4),   # fp32 by FMA on four warps
    ("f32-d64-qk-norm", dict(hidden=256, heads=16, kv_heads=1, head_dim=64, max_seq=700,
                             qk_norm=True), "f32", [700, 3], 2),
    ("d160", dict(hidden=256, heads=8, kv_heads=2, head_dim=160, max_seq=700), "bf16",
     [700, 1, 0, 129], 4),    # head_dim 144-240: copies a power of two of lanes a row
    ("d224-qk-norm", dict(hidden=256, heads=4, kv_heads=2, head_dim=224, max_seq=600,
                          qk_norm=True), "f16", [600, 17], 2),
    ("f32-d96", dict(hidden=256, heads=4, kv_heads=2, head_dim=96, max_seq=500), "f32",
     [500, 2], 2),
    ("f32-d192", dict(hidden=256, heads=4, kv_heads=2, head_dim=192, max_seq=400), "f32",
     [400, 0, 65], 4),
    ("f32-g20", dict(hidden=256, heads=40, kv_heads=2, head_dim=64, max_seq=600), "f32",
     [600, 1], 2),            # f32 query blocks
]
TOL = {"f32": (1e-4, 1e-5)}   # (vs float64, vs the simulator); 16-bit: (1e-2, 2e-3)


def _module(case):
    _, sizes, dtype, _, _ = case
    sizes = dict(sizes)
    theta = sizes.pop("theta", 10000.0)
    return attention_block(eps=1e-5, theta=theta, dtype=dtype, **sizes)


def compiled(case):
    return fc.compile(_module(case), max_batch=case[4], lowering="v2")


def precompile():
    for case in CASES:
        compiled(case)
    compiled(REPLAY)


def _lens(case, rng):
    if case[3] is not None:
        return case[3]
    return [int(n) for n in rng.integers(0, case[1]["max_seq"] + 1, case[4])]


def _call(fn, g, args):
    import cupy
    dev = {p.name: upload(args[p.name], p.type.dtype) for p in g.params}
    o = g.outputs[0]
    y = upload(np.zeros(args["x"].shape), o.type.dtype)
    y.fill(nan_bits(o.type.dtype))   # poisoned: every element must be written
    outs = fn(**dev, outputs={o.name: y})
    cupy.cuda.get_current_stream().synchronize()
    return [download(a, v.type.dtype) for a, v in zip(outs, g.outputs)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_attention_v2_against_float64(case):
    m = _module(case)
    g = m.graphs[0]
    fn = compiled(case)
    rng = np.random.default_rng()
    lens = _lens(case, rng)
    args = random_inputs(g, len(lens), lens, rng)
    got = _call(fn, g, args)
    ref = interpret(m, args, precise=True)
    sim = simulate(fn.module, args)
    e_ref = max(rel_err(a, r) for a, r in zip(got, ref))
    e_sim = max(rel_err(a, s) for a, s in zip(got, sim))
    loaded = list(fn._loaded.values())
    record("attention v2", case[0],
           f"vs f64 {e_ref:.1e}, vs sim {e_sim:.1e}, {len(loaded)} kernels")
    assert all(np.isfinite(a[np.isfinite(r)]).all() for a, r in zip(got, ref))
    tol_ref, tol_sim = TOL.get(case[2], (1e-2, 2e-3))
    assert e_ref <= tol_ref and e_sim <= tol_sim
    from fusionc.passes.stream import FUSE_ATTENTION   # on: the block in 1-2 kernels if it fits
    want = (1,) if case[4] > 32 else (1, 2, 3) if FUSE_ATTENTION else (3,)
    assert len(loaded) in want   # 33+ rows: GEMMs around the units
    assert all(int(lk.counters.sum()) == 0 for lk in loaded)


REPLAY = ("replay", dict(hidden=512, heads=8, kv_heads=2, head_dim=128, max_seq=1024), "f16",
          None, 4)


def test_attention_v2_graph_replays_follow_the_lengths():
    """One CUDA graph, 50 replays; seq_lens and positions grow by one each step on the device
    (the split plan follows them there): the caches and outputs equal 50 eager steps."""
    import cupy
    m = _module(REPLAY)
    g = m.graphs[0]
    fn = compiled(REPLAY)
    rng = np.random.default_rng()
    lens = [1, 300, 700, 901]
    args = random_inputs(g, 4, lens, rng)
    for name in ("k_cache", "v_cache"):   # defined everywhere: both runs write the same rows
        args[name] = rng.standard_normal(args[name].shape)
    eager = {p.name: upload(args[p.name], p.type.dtype) for p in g.params}
    graph = {p.name: upload(args[p.name], p.type.dtype) for p in g.params}
    steps = 50
    outs = []
    for _ in range(steps):
        y, _, _ = fn(**eager)
        outs.append(y.copy())
        for name in ("seq_lens", "positions"):
            eager[name] += 1
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        fn(**graph)   # loads the kernels outside the capture
        stream.begin_capture()
        y_g, _, _ = fn(**graph)
        for name in ("seq_lens", "positions"):
            graph[name] += 1
        cg = stream.end_capture()
    types = {p.name: p.type.dtype for p in g.params}
    for name in ("k_cache", "v_cache"):   # the warm-up call appended once: start again
        graph[name][...] = upload(args[name], types[name])
    for name, v in (("seq_lens", lens), ("positions", [n - 1 for n in lens])):
        graph[name][...] = cupy.asarray(np.array(v, np.int32))
    worst = 0.0
    with stream:
        for i in range(steps):
            cg.launch(stream)
            stream.synchronize()
            a = download(y_g, g.outputs[0].type.dtype)
            b = download(outs[i], g.outputs[0].type.dtype)
            worst = max(worst, float(np.abs(a - b).max()))
    kc = [download(d["k_cache"], types["k_cache"]) for d in (eager, graph)]
    record("attention v2", "replays", f"{steps} steps, max |graph - eager| {worst:.1e}")
    assert worst == 0.0 and np.array_equal(kc[0], kc[1], equal_nan=True)
