"""fusionc's interpreter and tile-IR simulator agree with Hugging Face transformers (CPU).

Skipped where transformers is not installed (CI installs only the dev extra); the GPU
counterpart is tests/gpu/test_transformers_gpu.py.
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from fusionc.interp import interpret  # noqa: E402
from fusionc.ir import Module  # noqa: E402
from fusionc.passes import run_pipeline  # noqa: E402
from fusionc.runtime.pipelines import v2_default_pipeline  # noqa: E402
from fusionc.sim import simulate  # noqa: E402
from tests.passes.graphs import example, rel_err  # noqa: E402
from tests.reference.hf import attention_case, mlp_case  # noqa: E402

ATT = dict(hidden=256, heads=8, kv_heads=2, head_dim=64)


@pytest.mark.parametrize("family,example_name", [("llama", "llama3_8b"),
                                                 ("qwen3", "qwen3_qk_norm")])
def test_attention_block_matches_transformers(family, example_name):
    lens, max_seq = [9, 1, 30], 32
    m = example(example_name, **ATT, intermediate=64, max_seq=max_seq, dtype="f16",
                theta=10000.0, eps=1e-5)
    inputs, ref = attention_case(family, **ATT, lens=lens, max_seq=max_seq)
    g = m["attention"]
    assert rel_err(interpret(g, inputs)[0], ref) <= 1e-2
    low = run_pipeline(Module((g,)), v2_default_pipeline(g, len(lens)))
    assert rel_err(simulate(low, inputs, graph="attention")[0], ref) <= 1e-2


def test_mlp_block_matches_transformers():
    m = example("llama2_7b", hidden=256, heads=2, head_dim=128, intermediate=512, dtype="f16")
    inputs, ref = mlp_case("llama", hidden=256, inter=512, batch=3)
    g = m["mlp"]
    assert rel_err(interpret(g, inputs)[0], ref) <= 1e-2
    low = run_pipeline(Module((g,)), v2_default_pipeline(g, 3))
    assert rel_err(simulate(low, inputs, graph="mlp")[0], ref) <= 1e-2


MLA = dict(hidden=128, heads=4, nope=32, rope=16, v_head=32, latent=64)


@pytest.mark.parametrize("dtype,tol", [("f32", 1e-5), ("bf16", 1e-2)])
def test_mla_block_matches_transformers(dtype, tol):
    """examples/deepseek_v2_lite.py (weight-absorbed decode) against HF's DeepseekV2Attention
    (non-absorbed, whole sequence): the interpreter, and in bf16 the block lowered on v2 (MLA's
    only lowering; its tensor-core units refuse f32 by name) in the simulator."""
    pytest.importorskip("transformers.models.deepseek_v2")
    from fusionc.passes.stream import v2_pipeline
    from tests.reference.hf_mla import mla_case
    lens, max_seq = [9, 1, 30], 32
    m = example("deepseek_v2_lite", hidden=MLA["hidden"], heads=MLA["heads"],
                qk_nope=MLA["nope"], qk_rope=MLA["rope"], v_head=MLA["v_head"],
                kv_lora=MLA["latent"], max_seq=max_seq, dtype=dtype)
    inputs, ref = mla_case(**MLA, lens=lens, max_seq=max_seq, dtype=dtype)
    g = m["attention"]
    assert rel_err(interpret(g, inputs, precise=dtype == "f32")[0], ref) <= tol
    if dtype == "f32":
        return
    low = run_pipeline(Module((g,)), v2_pipeline(4))
    assert rel_err(simulate(low, inputs, graph="attention")[0], ref) <= tol
