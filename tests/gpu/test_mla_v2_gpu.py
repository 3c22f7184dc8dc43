"""The MLA block on lowering v2 (issue 27): v2 linears (W_UK and W_UV block-diagonal) and the
``mla_units`` kernel, at DeepSeek-V2-Lite's sizes (16 heads) and a DeepSeek-V3-sized layer
(128 heads, hidden 7168; with its compressed query, q_lora 1536, once), against the float64 reference from the paper's non-absorbed equations
(tests/reference/mla.py): rows of different lengths (a full one, an empty one from batch 4),
NaN past every row's length, the outputs checked for NaN, the appended row checked and every
other cache row untouched; past the fused bucket the mixed path (GEMMs around the units); and
CUDA-graph replays leaving the counters at zero; and against transformers' DeepseekV2Attention
where installed (tests/reference/hf_mla.py). v2 is MLA's only lowering: v1's five-phase kernel
is deleted, and the cases of its tests/gpu/test_mla_gpu.py are here (all but f32, which the
tensor-core units refuse by name, and a forced cluster size, a v1 option)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.gpu.common import record, rel
from tests.reference.mla import mla_step

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SIZES = dict(heads=16, nope=128, rope=64, latent=512, eps=1e-6, theta=10000.0)
# (batch, KV, heads, dtype)
CASES = [(1, 1024, 16, "bf16"), (4, 1024, 16, "bf16"), (4, 4096, 16, "bf16"),
         (16, 1024, 16, "bf16"), (16, 4096, 16, "bf16"), (64, 4096, 16, "bf16"),
         (3, 1024, 16, "f16"), (1, 16384, 16, "bf16"), (2, 1024, 128, "bf16"),
         (16, 4096, 128, "bf16"), (200, 1024, 16, "bf16"), (4, 4096, 16, "f32"),
         (2, 1024, 128, "f32"), (2, 4096, 128, "bf16", 1536),
         (2, 4096, 20, "bf16")]   # 20 heads in a block of 32: the merge skips padded heads
CASES = [c + (0,) * (5 - len(c)) for c in CASES]   # the last field: q_lora (DeepSeek-V3)
HF_CASE = ([100, 37, 1], 128)   # the transformers comparison: lengths, max_seq
TOL = {"f16": 1e-2, "bf16": 1e-2, "f32": 1e-4}   # 16-bit operands, fp32 (FMA) throughout


def build(max_seq, dtype, heads, q_lora=0):
    import sys
    sys.path.insert(0, str(EXAMPLES))
    import deepseek_v2_lite
    return deepseek_v2_lite.build(max_seq=max_seq, dtype=dtype, heads=heads,
                                  hidden=2048 if heads <= 16 else 7168, q_lora=q_lora)


def compiled(batch, max_seq, heads, dtype, q_lora=0):
    import fusionc as fc
    return fc.compile(build(max_seq, dtype, heads, q_lora),
                      max_batch=1 << (batch - 1).bit_length(), kv_len=max_seq, lowering="v2")


def precompile():
    lens, max_seq = HF_CASE
    for case in CASES + [(len(lens), max_seq, 16, "bf16")]:
        compiled(*case)


def inputs(g, batch, kv, rng):
    """tests.passes.graphs.inputs (NaN past every row's length) with rows of different lengths
    (the first full, an empty one from batch 4), rounded to the model dtype."""
    from fusionc.interp.numerics import round_to
    from tests.passes.graphs import inputs as graph_inputs
    lens = [kv] + [int(n) for n in rng.integers(1, kv + 1, batch - 1)]
    if batch >= 4:
        lens[1] = 0   # an empty row: zeros from the attention, never NaN
    dt = g.params[0].type.dtype
    out = graph_inputs(g, batch, lens, rng)
    return {k: (round_to(v, dt).astype(np.float64) if v.dtype != np.int32 else v)
            for k, v in out.items()}, lens


def check_rows(out, cache, a, lens, sizes) -> tuple[float, float]:
    """(the worst relative error of the block's rows, of the appended cache rows) against
    mla_step at ``sizes``; every output finite, every other cache row untouched."""
    w = {k: v for k, v in a.items() if k.startswith("w") or "norm" in k}
    errs, row_errs = [], []
    for b in range(len(lens)):
        want, new = mla_step(w, a["x"][b], a["cache"][b], int(a["positions"][b]), lens[b],
                             **sizes)
        assert np.all(np.isfinite(out[b])), b
        errs.append(rel(out[b], want))
        p = int(a["positions"][b])
        row_errs.append(rel(cache[b, p], new))
        keep = np.ones(cache.shape[1], bool)
        keep[p] = False
        assert np.array_equal(cache[b, keep], a["cache"][b, keep], equal_nan=True), b
    return max(errs), max(row_errs)


def _check(fn, g, a, lens, heads):
    from fusionc.runtime.transfer import download, upload
    dev = {p.name: upload(a[p.name], p.type.dtype) for p in g.params}
    out, cache = (download(t, v.type.dtype).astype(np.float64)
                  for t, v in zip(fn(**dev), g.outputs))
    return check_rows(out, cache, a, lens, SIZES | {"heads": heads})


@pytest.mark.gpu
@pytest.mark.parametrize("batch,kv,heads,dtype,q_lora", CASES)
def test_mla_v2_matches_the_paper_equations(batch, kv, heads, dtype, q_lora):
    fn = compiled(batch, kv, heads, dtype, q_lora)
    g = build(kv, dtype, heads, q_lora)["attention"]
    a, lens = inputs(g, batch, kv, np.random.default_rng(batch * 7 + kv + heads))
    err, row = _check(fn, g, a, lens, heads)
    assert err <= TOL[dtype] and row <= TOL[dtype], (err, row)
    record("mla v2", f"{heads} heads {dtype} B={batch} KV={kv} q_lora={q_lora}",
           f"out {err:.1e}, cache row {row:.1e}; {fn.report().splitlines()[0]}")


@pytest.mark.gpu
def test_mla_v2_replayed_in_a_cuda_graph_gives_the_same_result():
    """The merge counters are back at zero after every launch: 20 replays of a split row
    (16K tokens over many chunks) give the first call's output bit for bit."""
    import cupy
    from fusionc.runtime.transfer import download, upload
    batch, kv, heads = 2, 16384, 16
    fn = compiled(batch, kv, heads, "bf16")
    g = build(kv, "bf16", heads)["attention"]
    a, lens = inputs(g, batch, kv, np.random.default_rng(5))
    dev = {p.name: upload(a[p.name], p.type.dtype) for p in g.params}
    first = download(fn(**dev)[0], g.outputs[0].type.dtype)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        fn(**dev)   # warm-up on the capturing stream (cuBLAS handles)
        graph_out = []
        stream.begin_capture()
        graph_out.append(fn(**dev)[0])
        graph = stream.end_capture()
        for _ in range(20):
            graph.launch(stream)
        stream.synchronize()
    again = download(graph_out[0], g.outputs[0].type.dtype)
    assert np.array_equal(first, again)


@pytest.mark.gpu
def test_mla_v2_matches_transformers():
    """The MLA block at DeepSeek-V2-Lite's sizes against HF's DeepseekV2Attention (float64,
    whole sequences with a causal mask; tests/reference/hf_mla.py)."""
    pytest.importorskip("transformers.models.deepseek_v2")
    from fusionc.runtime.transfer import download, upload
    from tests.reference.hf_mla import mla_case
    lens, max_seq = HF_CASE
    inputs, ref = mla_case(hidden=2048, heads=16, nope=128, rope=64, v_head=128, latent=512,
                           lens=lens, max_seq=max_seq)
    fn = compiled(len(lens), max_seq, 16, "bf16")
    g = build(max_seq, "bf16", 16)["attention"]
    dev = {p.name: upload(inputs[p.name], p.type.dtype) for p in g.params}
    out = download(fn(**dev)[0], g.outputs[0].type.dtype).astype(np.float64)
    err = rel(out, ref)
    assert np.all(np.isfinite(out)) and err <= TOL["bf16"], err
    record("mla v2", "DeepSeek-V2-Lite bf16 vs transformers DeepseekV2Attention", f"{err:.1e}")
