"""DeepSeek-V2-Lite MLA block (examples/deepseek_v2_lite.py, real sizes) compiled by
fusionc.compile and run on the GPU against the float64 reference written from the paper's
non-absorbed equations (tests/reference/mla.py), and against transformers' DeepseekV2Attention
where installed (tests/reference/hf_mla.py): random weights and caches (NaN past every row's
length), rows of different lengths, the output allocated and checked for NaN, the appended
cache row checked and every other cache row left untouched."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.gpu.common import record, rel
from tests.reference.mla import mla_step

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SIZES = dict(heads=16, nope=128, rope=64, latent=512, eps=1e-6, theta=10000.0)
# (batch, KV, cluster size (0: cost model), dtype): bf16 takes the tensor-core attention path,
# f32 the CUDA-core one
CASES = [(1, 1024, 0, "bf16"), (4, 1024, 0, "bf16"), (16, 4096, 0, "bf16"),
         (1, 16384, 0, "bf16"), (4, 4096, 4, "bf16"), (3, 1024, 0, "f32")]
TOL = {"bf16": 1e-2, "f32": 1e-4}


def build(max_seq, dtype):
    sys.path.insert(0, str(EXAMPLES))
    import deepseek_v2_lite
    return deepseek_v2_lite.build(max_seq=max_seq, dtype=dtype)


def compiled(batch, max_seq, cluster, dtype):
    import fusionc as fc
    return fc.compile(build(max_seq, dtype), max_batch=1 << (batch - 1).bit_length(),
                      kv_len=max_seq, cluster=cluster)


def precompile():
    for case in CASES + [(3, 128, 0, "bf16")]:   # the last: the transformers comparison
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


@pytest.mark.gpu
@pytest.mark.parametrize("batch,kv,cluster,dtype", CASES)
def test_mla_block_matches_the_paper_equations(batch, kv, cluster, dtype):
    from fusionc.runtime.transfer import download, upload
    fn = compiled(batch, kv, cluster, dtype)
    g = build(kv, dtype)["attention"]
    a, lens = inputs(g, batch, kv, np.random.default_rng(batch * 7 + kv))
    dev = {p.name: upload(a[p.name], p.type.dtype) for p in g.params}
    out, cache = (download(t, v.type.dtype).astype(np.float64)
                  for t, v in zip(fn(**dev), g.outputs))
    err, row = check_rows(out, cache, a, lens, SIZES)
    assert err <= TOL[dtype] and row <= TOL[dtype], (err, row)
    record("mla", f"DeepSeek-V2-Lite {dtype} B={batch} KV={kv} C={cluster or 'auto'}",
           f"out {err:.1e}, cache row {row:.1e}; {fn.report().splitlines()[0]}")


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


@pytest.mark.gpu
def test_mla_block_matches_transformers():
    """The fused kernel at DeepSeek-V2-Lite's sizes against HF's DeepseekV2Attention (float64,
    whole sequences with a causal mask; tests/reference/hf_mla.py)."""
    pytest.importorskip("transformers.models.deepseek_v2")
    from fusionc.runtime.transfer import download, upload
    from tests.reference.hf_mla import mla_case
    lens, max_seq = [100, 37, 1], 128
    inputs, ref = mla_case(hidden=2048, heads=16, nope=128, rope=64, v_head=128, latent=512,
                           lens=lens, max_seq=max_seq)
    fn = compiled(len(lens), max_seq, 0, "bf16")
    g = build(max_seq, "bf16")["attention"]
    dev = {p.name: upload(inputs[p.name], p.type.dtype) for p in g.params}
    out = download(fn(**dev)[0], g.outputs[0].type.dtype).astype(np.float64)
    err = rel(out, ref)
    assert np.all(np.isfinite(out)) and err <= 1e-2, err
    record("mla", "DeepSeek-V2-Lite bf16 vs transformers DeepseekV2Attention", f"{err:.1e}")
