"""Split-KV decode attention tile ops on the GPU (attn_partial, the two ClusterReduce merges,
attn_rescale, attn_finish, kv_append) against the simulator and a float64 reference, with KV
lengths 1, 15, 16, 17, 255, 257 (and 0, 37), NaN in the caches past each row's length, more
chunks than tokens, and a length-0 row that must come out exactly 0."""

from __future__ import annotations

import numpy as np
import pytest

from fusionc.interp.numerics import round_to
from fusionc.ir import DType
from fusionc.sim import simulate_kernel
from tests.codegen.programs import attention_kernel
from tests.gpu.common import kernel, record, rel

CONFIGS = [  # attn_partial streamed (lanes across head_dim) unless head_dim does not split
    dict(),   # into a power of two of 16-byte vectors (72) or attn_stream = 0 (staged tiles)
    dict(head_dim=64, group=4, dtype="bf16", cluster=8),
    dict(head_dim=72, group=1, dtype="f32", cluster=2),
    dict(cluster=16),
    dict(head_dim=128, group=8, dtype="f32", cluster=2),
    dict(group=4, attn_stream=0),
    dict(group=2, attn_stream=1),  # streamed without the prefetch
]
LENGTHS = [[1, 15, 16, 17], [255, 257, 0, 37]]
S = 300


def case(cfg):
    cfg = dict(cfg)
    opts = {"attn_stream": cfg.pop("attn_stream")} if "attn_stream" in cfg else {}
    return kernel(attention_kernel(max_seq=S, **cfg), **opts), opts


def precompile():
    for cfg in CONFIGS:
        case(cfg)


def reference(a, heads, group, d, scale):
    """float64 attention over tokens [0, n) with the token at pos taken from k_new / v_new."""
    q, kc, vc = (a[n].astype(np.float64) for n in ("q", "kc", "vc"))
    kn, vn = a["knew"].astype(np.float64), a["vnew"].astype(np.float64)
    y = np.zeros(q.shape)
    for b, (n, p) in enumerate(zip(a["lens"], a["pos"])):
        for h in range(heads):
            keys, vals = kc[b, :n, h].copy(), vc[b, :n, h].copy()
            if 0 <= p < n:
                keys[p], vals[p] = kn[b, h * d : (h + 1) * d], vn[b, h * d : (h + 1) * d]
            for g in range(h * group, (h + 1) * group):
                if n:
                    s = keys @ q[b, g] * scale
                    e = np.exp(s - s.max())
                    y[b, g] = e @ vals / e.sum()
    return y


def inputs(cfg, lengths, dt, rng):
    heads, group, d = 2, cfg.get("group", 2), cfg.get("head_dim", 128)
    b = len(lengths)
    lens = np.array(lengths, np.int32)
    a = {
        "q": rng.standard_normal((b, heads * group, d)),
        "kc": rng.standard_normal((b, S, heads, d)),
        "vc": rng.standard_normal((b, S, heads, d)),
        "lens": lens,
        "pos": np.maximum(lens - 1, 0).astype(np.int32),
        "knew": rng.standard_normal((b, heads * d)),
        "vnew": rng.standard_normal((b, heads * d)),
        "y": np.full((b, heads * group, d), np.nan),
    }
    for i, n in enumerate(lengths):  # poison past the length
        a["kc"][i, n:] = np.nan
        a["vc"][i, n:] = np.nan
    return (
        {k: (round_to(v, dt) if v.dtype.kind == "f" else v) for k, v in a.items()},
        heads,
        group,
        d,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_attention_tile_program(cfg, lengths):
    from fusionc.codegen import CodegenOptions
    from fusionc.runtime.run import run_kernel

    k, opts = case(cfg)
    dt = DType(cfg.get("dtype", "f16"))
    a, heads, group, d = inputs(cfg, lengths, dt, np.random.default_rng(sum(lengths)))
    want = simulate_kernel(k, a)
    got = run_kernel(k, a, options=CodegenOptions(**opts))
    ref = reference(a, heads, group, d, 1.0 / d**0.5)
    y = got["y"].astype(np.float64)
    e_sim, e_ref = rel(y, want["y"]), rel(y, ref)
    record(
        "attention",
        f"{dt} D={d} G={group} C={cfg.get('cluster', 4)} {opts or ''} lens={lengths}",
        f"vs sim {e_sim:.1e}, vs float64 {e_ref:.1e}",
    )
    assert not np.isnan(y).any()
    tol = 1e-5 if dt == DType.f32 else 1e-2
    assert e_sim <= tol and e_ref <= tol
    for i, n in enumerate(lengths):
        if n == 0:
            assert np.all(got["y"][i] == 0) and not np.signbit(got["y"][i]).any()
    for cache in ("kc", "vc"):  # kv_append wrote exactly the new token, nothing else
        assert np.array_equal(got[cache], want[cache], equal_nan=True)
