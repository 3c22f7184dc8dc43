"""Lowering v2's host attention on the GPU: decode attentions the attention units do not take
(head_dim 272 and 512, f32 at head_dim 208, caches swapped, an attention output with no O
projection) run as ``fusionc.runtime.library_attention``'s RoPE, in-place KV append and decode
attention kernels between cuBLAS GEMMs. Against the float64 interpreter, every output
poisoned, rows of 0 keys and of a full cache included; the caches' appended rows checked."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import numpy as np
import pytest

import fusionc as fc
from fusionc.interp import interpret
from fusionc.runtime.transfer import download, nan_bits, upload
from tests.gpu.common import record
from tests.passes.graphs import inputs as random_inputs, rel_err
from tests.passes.test_host_attention import CASES, _block

pytestmark = pytest.mark.gpu

GPU_CASES = dict(CASES, **{"head_dim 512 bf16": lambda: _block("bf16", head_dim=512,
                                                                heads=8, kv_heads=2)})
TOL = 1e-2   # 16-bit operands, fp32 accumulation (f32: 1e-4)


def _call(fn, g, args):
    """``fn`` on uploaded ``args``, its pure outputs poisoned first; the caches in place."""
    import cupy
    dev = {p.name: upload(args[p.name], p.type.dtype) for p in g.params}
    env = {"B": len(args["seq_lens"])}
    pure = {}
    for v in g.outputs[:1]:
        y = upload(np.zeros(v.type.concrete(env)), v.type.dtype)
        y.fill(nan_bits(v.type.dtype))
        pure[v.name] = y
    outs = fn(**dev, outputs=pure)
    cupy.cuda.get_current_stream().synchronize()
    return [download(a, v.type.dtype) for a, v in zip(outs, g.outputs)]


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_host_attention_against_float64(case, rows):
    m = GPU_CASES[case]()
    g = m.graphs[0]
    fn = fc.compile(m, max_batch=rows)
    assert not fn._loaded   # no fused kernel: GEMMs and library kernels only
    rng = np.random.default_rng()
    lens = rng.integers(1, 49, rows)
    lens[0] = 48
    if rows > 1:
        lens[1] = 0   # an empty row: zeros, no NaN, the others unaffected
    args = random_inputs(g, rows, lens.tolist(), rng)
    got = _call(fn, g, args)
    ref = interpret(m, args, precise=True)
    errs = [rel_err(a, r) for a, r in zip(got, ref)]
    record("host attention", f"{case} B={rows}", f"vs f64 {max(errs):.1e}")
    tol = 1e-4 if "f32" in case else TOL
    assert all(np.isfinite(e) and e <= tol for e in errs), errs
