"""The decode step's ends on the GPU (``fusionc.models.blocks.step_ends``): ``@head`` (final
RMSNorm, then the LM head as a linear with fp32 logits: the fused v2 kernel up to the batch
bucket, a cuBLAS GEMM with an fp32 output past it) and ``@embed`` (the gather of token rows),
each against the float64 interpreter on fresh random inputs, outputs poisoned first."""
from __future__ import annotations

import numpy as np
import pytest

import fusionc as fc
from fusionc.interp import interpret
from fusionc.interp.numerics import round_to
from fusionc.ir import DType
from fusionc.models.blocks import step_ends
from fusionc.models.config import ModelConfig
from tests.gpu.common import record, rel

pytestmark = pytest.mark.gpu

# (vocab, hidden, dtype, batch, max_batch): Llama-2's vocabulary, Llama-3's over a short row
# (2004 groups of 64 rows), Qwen3-4B's hidden size, rows TMA cannot copy (1003 · 2 bytes), and
# past the fused bucket (the library path's GEMM with an fp32 output)
CASES = [(32000, 4096, "f16", 1, 1), (128256, 256, "bf16", 4, 4), (20000, 2560, "bf16", 16, 16),
         (1000, 1003, "f16", 3, 4), (32000, 3072, "bf16", 64, 64), (5000, 2048, "f16", 200, 200)]


def _module(vocab: int, hidden: int, dtype: str):
    cfg = ModelConfig("llama", 1, hidden, 8, 8, 64, 256, vocab, 1e-5, 10000.0, dtype=dtype)
    return step_ends(cfg, dtype)


def compiled(case, graph: str):
    vocab, hidden, dt, _, mb = case
    return fc.compile(_module(vocab, hidden, dt), graph, max_batch=mb)


def precompile():
    for case in CASES:
        compiled(case, "head")
        compiled(case, "embed")


def _poisoned(shape, dt: DType):
    import cupy
    from fusionc.runtime.arrays import _CUPY
    from fusionc.runtime.transfer import nan_bits
    y = cupy.empty(shape, _CUPY[dt])
    y.fill(nan_bits(dt))
    return y


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_head_logits_against_float64(case):
    import cupy
    from fusionc.runtime.transfer import upload
    vocab, hidden, dt, batch, _ = case
    d, rng = DType(dt), np.random.default_rng()
    args = {"x": rng.standard_normal((batch, hidden)) * 3,
            "final_norm": 1 + 0.2 * rng.standard_normal(hidden),
            "lm_head": rng.standard_normal((vocab, hidden)) / np.sqrt(hidden)}
    args = {k: np.asarray(round_to(v, d), np.float64) for k, v in args.items()}
    ref, = interpret(_module(vocab, hidden, dt), args, graph="head", precise=True)
    fn = compiled(case, "head")
    y = _poisoned((batch, vocab), DType.f32)
    fn(**{k: upload(v, d) for k, v in args.items()}, outputs={"logits": y})
    out = y.get()
    cupy.cuda.get_current_stream().synchronize()
    err = rel(out, ref)
    record("step ends", f"head {'-'.join(map(str, case))}", f"{err:.1e}")
    assert out.dtype == np.float32 and np.isfinite(out).all() and err <= 1e-2
    assert all(lk.errors() == 0 for lk in fn._loaded.values())


@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: "-".join(map(str, c)))
def test_embedding_rows_and_ids_outside_the_table(case):
    """Rows equal bit for bit; ids outside [0, vocab) give zero rows, not a fault."""
    import cupy
    from fusionc.runtime.transfer import download, upload
    vocab, hidden, dt, batch, _ = case
    d, rng = DType(dt), np.random.default_rng()
    table = np.asarray(round_to(rng.standard_normal((vocab, hidden)), d), np.float64)
    tokens = rng.integers(0, vocab, batch + 2).astype(np.int32)
    tokens[-2:] = (-1, vocab)
    fn = fc.compile(_module(vocab, hidden, dt), "embed", max_batch=batch + 2)
    y = _poisoned((batch + 2, hidden), d)
    fn(embed=upload(table, d), tokens=cupy.asarray(tokens), outputs={"x": y})
    out = download(y, d)
    record("step ends", f"embed {'-'.join(map(str, case))}", "rows")
    assert np.array_equal(out[:batch], table[tokens[:batch]])
    assert not out[batch:].any()
