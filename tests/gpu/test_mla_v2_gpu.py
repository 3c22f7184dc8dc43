"""The MLA block on lowering v2 (issue 27): v2 linears (W_UK and W_UV block-diagonal) and the
``mla_units`` kernel, at DeepSeek-V2-Lite's sizes (16 heads) and a DeepSeek-V3-sized layer
(128 heads, hidden 7168; with its compressed query, q_lora 1536, once), against the float64 reference from the paper's non-absorbed equations
(tests/reference/mla.py): rows of different lengths (a full one, an empty one from batch 4),
NaN past every row's length, the outputs checked for NaN, the appended row checked and every
other cache row untouched; past the fused bucket the mixed path (GEMMs around the units); and
CUDA-graph replays leaving the counters at zero."""
from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.common import record, rel
from tests.gpu.test_mla_gpu import SIZES, check_rows, inputs

# (batch, KV, heads, dtype)
CASES = [(1, 1024, 16, "bf16"), (4, 4096, 16, "bf16"), (16, 1024, 16, "bf16"),
         (64, 4096, 16, "bf16"), (3, 1024, 16, "f16"), (1, 16384, 16, "bf16"),
         (2, 1024, 128, "bf16"), (16, 4096, 128, "bf16"), (200, 1024, 16, "bf16"),
         (4, 4096, 16, "f32"), (2, 1024, 128, "f32"), (2, 4096, 128, "bf16", 1536)]
CASES = [c + (0,) * (5 - len(c)) for c in CASES]   # the last field: q_lora (DeepSeek-V3)
TOL = {"f16": 1e-2, "bf16": 1e-2, "f32": 1e-4}   # 16-bit operands, fp32 (FMA) throughout


def build(max_seq, dtype, heads, q_lora=0):
    import sys
    from tests.gpu.test_mla_gpu import EXAMPLES
    sys.path.insert(0, str(EXAMPLES))
    import deepseek_v2_lite
    return deepseek_v2_lite.build(max_seq=max_seq, dtype=dtype, heads=heads,
                                  hidden=2048 if heads <= 16 else 7168, q_lora=q_lora)


def compiled(batch, max_seq, heads, dtype, q_lora=0):
    import fusionc as fc
    return fc.compile(build(max_seq, dtype, heads, q_lora),
                      max_batch=1 << (batch - 1).bit_length(), kv_len=max_seq, lowering="v2")


def precompile():
    for case in CASES:
        compiled(*case)


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
