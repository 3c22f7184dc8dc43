"""The cluster kernels of the example models (DSL -> partition-cluster -> fuse -> codegen:
lowering v1's attention blocks) at batch 1 on the GPU against the simulator, at the models'
real sizes: Llama-2-7B attention (RMSNorm, QKV, RoPE, KV append, split-KV attention, O
projection + residual), Llama-3-8B (GQA, bf16) and Qwen3 (QK-norm). The MLPs are design v2's
streamed kernels (tests/gpu/test_graphs_v2_gpu.py)."""
from __future__ import annotations

import numpy as np
import pytest

from fusionc.sim import simulate_kernel
from tests.codegen.examples import fitting_kernel
from tests.gpu.common import PRECOMPILE, record, rel

CASES = [("llama2_7b", "attention_k0"), ("llama3_8b", "attention_k0"),
         ("qwen3_qk_norm", "attention_k0")]
LEN = 100  # tokens in the cache after this step; the new one is at position LEN - 1


def precompile():
    for ex, name in CASES:
        PRECOMPILE.append((fitting_kernel(ex, name)[0], None, {}))


def inputs(k, rng):
    out = {}
    outputs = {v.name for v in k.outputs}
    for p in k.params:
        shape = p.type.concrete({"B": 1})
        if p.type.dtype.value == "i32":
            out[p.name] = np.array([LEN if "len" in p.name else LEN - 1], np.int32)
        elif p.name in outputs and len(shape) == 2:
            out[p.name] = np.full(shape, np.nan, np.float32)  # the block's output
        elif len(shape) == 4:  # a KV cache: NaN past the valid tokens
            c = rng.standard_normal(shape, dtype=np.float32)
            c[:, LEN:] = np.nan
            out[p.name] = c
        else:
            scale = 1 / np.sqrt(shape[-1]) if len(shape) == 2 and p.name.startswith("w") else 1
            out[p.name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("example,name", CASES)
def test_example_kernel_matches_simulator(example, name):
    from fusionc.codegen import compile_kernel
    from fusionc.runtime.run import run_kernel
    k, lowered = fitting_kernel(example, name)
    a = inputs(k, np.random.default_rng(0))
    want = simulate_kernel(k, a)
    got = run_kernel(k, a)
    notes = []
    for v in k.outputs:
        g, w = got[v.name].astype(np.float64), want[v.name].astype(np.float64)
        if g.ndim == 4:  # caches: untouched except the appended row
            rows = np.ones(g.shape[1], bool)
            rows[LEN - 1] = False
            assert np.array_equal(g[:, rows], w[:, rows], equal_nan=True)
            g, w = g[:, LEN - 1], w[:, LEN - 1]
        e = rel(g, w)
        notes.append(f"{v.name} {e:.1e}")
        assert np.all(np.isfinite(g)) and e <= 1e-2, (v.name, e)
    ck = compile_kernel(k)
    record("example", f"{example} {name} B=1{' (max_batch 1)' if lowered else ''}",
           f"vs sim: {', '.join(notes)}; {ck.registers} regs, {ck.smem_bytes} B smem")
