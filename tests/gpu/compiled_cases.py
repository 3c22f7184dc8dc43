"""Cases of the end-to-end GPU tests (fusionc.compile), shared with the CPU precompile step.

The sampled grid of issue 7: every example model (sizes reduced where it does not change the
structure: real head_dim and GQA ratios, hidden ≠ heads·head_dim for Qwen3) × fp16/bf16 ×
batch {1, 4, 16} × KV {1, 100, 4096, 16384}, rows of different lengths. (tp2_mlp runs on two
GPUs: tests/gpu/test_tp2_gpu.py.)
"""

import math

import numpy as np

import fusionc as fc
from tests.passes.graphs import EXAMPLES, example  # noqa: F401  (re-exported for the tests)

SIZES = {"llama2_7b": dict(hidden=512, heads=4, head_dim=128, intermediate=1024),
         "llama3_8b": dict(hidden=512, heads=8, kv_heads=2, head_dim=128, intermediate=1024),
         "qwen3_qk_norm": dict(hidden=384, heads=8, kv_heads=2, head_dim=128, intermediate=768)}

GRID = [("llama2_7b", "f16", 1, 1), ("llama2_7b", "bf16", 4, 100),
        ("llama2_7b", "f16", 16, 4096), ("llama2_7b", "bf16", 1, 16384),
        ("llama3_8b", "bf16", 1, 4096), ("llama3_8b", "f16", 4, 16384),
        ("llama3_8b", "bf16", 16, 100), ("llama3_8b", "f16", 1, 1),
        ("qwen3_qk_norm", "f16", 4, 4096), ("qwen3_qk_norm", "bf16", 16, 1),
        ("qwen3_qk_norm", "bf16", 1, 16384), ("qwen3_qk_norm", "f16", 16, 100)]


def grid_module(name, dtype, kv):
    return example(name, **SIZES[name], max_seq=kv, dtype=dtype)


def bucket(batch: int) -> int:
    return 1 << (batch - 1).bit_length()


def compiled(module, graph, batch, kv):
    return fc.compile(module, graph, max_batch=bucket(batch), kv_len=kv)


def fusionc_compile(module, graph, max_batch):
    return fc.compile(module, graph, max_batch=max_batch)


def row_lengths(batch: int, kv: int, rng) -> list[int]:
    """Different lengths per row: the first row full, a 0-length row from batch 4 on."""
    lens = list(rng.integers(1, kv + 1, batch))
    lens[0] = kv
    if batch >= 4:
        lens[1] = 0
    return [int(n) for n in lens]


def attention_only(*, hidden, heads, kv_heads, head_dim, max_seq, dtype="f16", style="neox",
                   rotary_dim=None, theta=10000.0, flat=False):
    """An attention block without output projection: returns the attention output itself
    [B, heads, head_dim] (``flat``: merged to [B, heads·head_dim], the form the attention
    units write) and the caches, so failure classes can be read off directly."""
    T = fc.dtype(dtype)
    q, kvd = heads * head_dim, kv_heads * head_dim
    cache = T["B", max_seq, kv_heads, head_dim]

    @fc.graph
    def attention(x: T["B", hidden], attn_norm: T[hidden], w_qkv: T[q + 2 * kvd, hidden],
                  k_cache: cache, v_cache: cache, positions: fc.i32["B"],
                  seq_lens: fc.i32["B"]):
        h = fc.rms_norm(x, attn_norm, 1e-5)
        qq, k, v = fc.split(fc.linear(h, w_qkv), [q, kvd, kvd])
        qq = fc.rope(fc.split_heads(qq, heads), positions, theta, style, rotary_dim)
        k = fc.rope(fc.split_heads(k, kv_heads), positions, theta, style, rotary_dim)
        k_cache, v_cache = fc.kv_cache_append(k_cache, v_cache, k, fc.split_heads(v, kv_heads),
                                              positions)
        o = fc.decode_attention(qq, k_cache, v_cache, seq_lens, 1 / math.sqrt(head_dim))
        return (fc.merge_heads(o) if flat else o), k_cache, v_cache

    return attention


FAILURE = dict(hidden=128, heads=4, kv_heads=2, head_dim=64)
TAILS = [1, 15, 16, 17, 255, 256, 257, 1000]


def failure_cases():
    """(id, module, graph, batch, kv) of the failure-class tests: attention outputs flattened
    to [B, heads·head_dim] (the attention units' form; head_dim 72 runs on the host)."""
    out = [("kv_tails", attention_only(**FAILURE, max_seq=1000, flat=True), "attention", 8,
            1000),
           ("empty_rows", attention_only(**FAILURE, max_seq=512, flat=True), "attention", 4,
            512),
           ("more_splits", attention_only(**FAILURE, max_seq=8, flat=True), "attention", 1, 8),
           ("rope_gptj_far", attention_only(hidden=128, heads=2, kv_heads=1, head_dim=128,
                                            max_seq=100_002, style="gptj", rotary_dim=64,
                                            flat=True), "attention", 1, 100_002)]
    for d in (64, 72, 80, 96, 256):
        out.append((f"head_dim_{d}", attention_only(hidden=128, heads=2, kv_heads=1,
                                                     head_dim=d, max_seq=300, flat=True),
                    "attention", 2, 300))
    out.append(("rmsnorm_mlp", example("llama2_7b", hidden=256, heads=2, head_dim=128,
                                       intermediate=512), "mlp", 4, 1))
    return out


def precompile() -> None:
    for name, dtype, batch, kv in GRID:
        m = grid_module(name, dtype, kv)
        for g in ("attention", "mlp"):
            compiled(m, g, batch, kv)
    for _, m, g, batch, kv in failure_cases():
        compiled(m, g, batch, kv)
    for dtype in ("f16", "bf16"):  # tests/gpu/test_runtime_gpu.py
        m = example("llama2_7b", hidden=256, heads=2, head_dim=128, intermediate=512,
                    max_seq=64, dtype=dtype)
        for mb in (2, 4):
            fusionc_compile(m, "mlp", mb)


def upload(graph, inputs):
    from fusionc.runtime.transfer import upload as up
    return {p.name: up(inputs[p.name], p.type.dtype) for p in graph.params}


def rel(out, ref) -> float:
    from tests.passes.graphs import rel_err
    return rel_err(out, ref)


def zero_rows_of_q(inputs, heads, head_dim):
    """Make q = 0 (zero q rows of the QKV weight): attention then averages V."""
    inputs["w_qkv"][: heads * head_dim] = 0
    return inputs


def poison_like(x):
    return np.full_like(x, np.nan)
