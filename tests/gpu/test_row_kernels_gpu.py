"""The row kernels of the library path (``fusionc.runtime.row_kernels`` through
``fusionc.runtime.library``) on the GPU against float64 references on fresh random inputs,
outputs poisoned with NaN first: every op and storage dtype, rows seen through strided views (a
split's halves), the QK-norm shape, an empty batch, ids outside the vocabulary; and a planned
library-path call of the four host ops (the call plan's raw row steps) against the same."""
from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.common import record, rel

pytestmark = pytest.mark.gpu
DTYPES = ["f16", "bf16", "f32"]
TOL = {"f16": 1e-2, "bf16": 1e-2, "f32": 1e-4}


def _dev(x, dt):
    from fusionc.ir import DType
    from fusionc.runtime.transfer import host_to_device_bits
    import cupy
    return cupy.asarray(host_to_device_bits(np.asarray(x, np.float64), DType(dt)))


def _host(a, dt):
    from fusionc.ir import DType
    from fusionc.runtime.transfer import device_bits_to_host
    return device_bits_to_host(a.get(), DType(dt)).astype(np.float64)


def _rounded(x, dt):
    from fusionc.interp.numerics import round_to
    from fusionc.ir import DType
    return round_to(np.asarray(x, np.float64), DType(dt)).astype(np.float64)


def _poisoned(shape, dt):
    return _dev(np.full(shape, np.nan), dt)


def _silu(u):
    return u / (1 + np.exp(-u))


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", ["add", "mul", "silu_mul", "silu"])
@pytest.mark.parametrize("rows,cols", [(1, 1024), (3, 333), (256, 4096), (0, 64)])
def test_elementwise_ops_match_float64(name, dt, rows, cols):
    from fusionc.runtime import library
    rng = np.random.default_rng(rows * 7 + cols)
    a, b = (_rounded(rng.standard_normal((rows, cols)), dt) for _ in range(2))
    ref = {"add": a + b, "mul": a * b, "silu_mul": _silu(a) * b, "silu": _silu(a)}[name]
    out = _poisoned((rows, cols), dt)
    args = [_dev(a, dt)] + ([] if name == "silu" else [_dev(b, dt)])
    getattr(library, name)(*args, out, dt)
    got = _host(out, dt)
    err = rel(got, ref) if rows else 0.0
    record("row_kernels", f"{name} {dt} {rows}x{cols}", f"{err:.1e}")
    assert not np.isnan(got).any() and err <= TOL[dt]


@pytest.mark.parametrize("dt", DTYPES)
def test_silu_mul_of_a_splits_halves_reads_them_in_place(dt):
    """gate and up as column slices of one [T, 2I] buffer (the fused w_gate_up), the output a
    column slice too: strided rows, no copies."""
    from fusionc.runtime import library
    rng = np.random.default_rng(5)
    gu = _rounded(rng.standard_normal((7, 2 * 96)), dt)
    d = _dev(gu, dt)
    out = _poisoned((7, 2 * 96), dt)
    library.silu_mul(d[:, :96], d[:, 96:], out[:, 96:], dt)
    got = _host(out, dt)
    assert np.isnan(got[:, :96]).all()   # the other half untouched
    assert rel(got[:, 96:], _silu(gu[:, :96]) * gu[:, 96:]) <= TOL[dt]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", [(1, 4096), (5, 3000), (256, 8192), (3, 8, 128), (0, 64)])
def test_rms_norm_matches_float64(dt, shape):
    from fusionc.runtime import library
    rng = np.random.default_rng(sum(shape))
    x = _rounded(rng.standard_normal(shape) * 3, dt)
    w = _rounded(rng.standard_normal(shape[-1]), dt)
    ref = w * x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5)
    out = _poisoned(shape, dt)
    d = shape[-1]
    library.rms_norm(_dev(x, dt).reshape(-1, d), _dev(w, dt), 1e-5, out.reshape(-1, d), dt)
    got = _host(out, dt)
    err = rel(got, ref) if shape[0] else 0.0
    record("row_kernels", f"rms_norm {dt} {shape}", f"{err:.1e}")
    assert not np.isnan(got).any() and err <= TOL[dt]


@pytest.mark.parametrize("src,dst", [(s, d) for s in DTYPES for d in DTYPES if s != d])
def test_casts_round_once(src, dst):
    from fusionc.runtime import library
    x = _rounded(np.random.default_rng(1).standard_normal((4, 1000)) * 100, src)
    out = _poisoned((4, 1000), dst)
    library.cast(_dev(x, src), out, src, dst)
    assert np.array_equal(_host(out, dst), _rounded(x, dst))


@pytest.mark.parametrize("dt", DTYPES)
def test_embedding_gathers_rows_and_zeros_ids_outside(dt):
    import cupy

    from fusionc.runtime import library
    table = _rounded(np.random.default_rng(2).standard_normal((50, 264)), dt)
    ids = np.array([3, 49, 0, -1, 50, 3], np.int32)
    out = _poisoned((6, 264), dt)
    library.embedding(_dev(table, dt), cupy.asarray(ids), out)
    want = np.where(((ids >= 0) & (ids < 50))[:, None], table[np.clip(ids, 0, 49)], 0.0)
    assert np.array_equal(_host(out, dt), want)


def test_a_planned_library_call_launches_row_kernels():
    """The host-ops graph (RMSNorm, a GEMM, SiLU, add) on the library path: the second call
    (planned: raw row steps, no CuPy kernel) equals the first (checked path) and float64."""
    import cupy

    import fusionc
    from benchmarks.host_overhead_cpu import host_ops_graph
    cg = fusionc.compile(host_ops_graph("bf16"), max_batch=8,
                         pipeline="fold-views,lower-library")
    rng = np.random.default_rng(3)
    x, n = (_rounded(rng.standard_normal(s), "bf16") for s in ((8, 1024), (1024,)))
    w = _rounded(rng.standard_normal((1024, 1024)) / 32, "bf16")
    h = _rounded(n * x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5), "bf16")
    y = _rounded(h @ w.T, "bf16")
    ref = x + _silu(y)
    args = dict(x=_dev(x, "bf16"), norm=_dev(n, "bf16"), w=_dev(w, "bf16"))
    first = _host(cg(**args)[0], "bf16")
    second = _host(cg(**args)[0], "bf16")
    cupy.cuda.Device().synchronize()
    assert cg._plans and all(p.run is not None for p in cg._plans.values())
    assert np.array_equal(first, second) and rel(second, ref) <= 1e-2


@pytest.mark.parametrize("dt,heads,kvh,d", [("bf16", 32, 8, 128), ("f16", 4, 4, 80),
                                            ("f32", 6, 2, 64), ("bf16", 8, 1, 256),
                                            ("f16", 32, 2, 64)])   # 16 a KV head: 2 warps
def test_chunk_attention_matches_float64(dt, heads, kvh, d):
    """Rows of two sequences (the second starting mid-cache: an earlier chunk's keys), each
    row causal up to its position, one launch (fusionc.runtime.library_attention)."""
    import cupy

    from fusionc.runtime.library_attention import chunk_attention
    rng = np.random.default_rng(heads + d)
    seqs, s_max = 3, 300
    kc, vc = (_rounded(rng.standard_normal((seqs, s_max, kvh, d)), dt) for _ in range(2))
    seq_of = np.array([0] * 37 + [2] * 70, np.int32)
    pos = np.concatenate([np.arange(37), np.arange(200, 270)]).astype(np.int32)
    q = _rounded(rng.standard_normal((len(pos), heads, d)), dt)
    scale = 1 / np.sqrt(d)
    ref = np.empty_like(q)
    g = heads // kvh
    for t, (s, p) in enumerate(zip(seq_of, pos)):
        k, v = kc[s, :p + 1], vc[s, :p + 1]   # [n, kvh, d]
        sc = np.einsum("kgd,nkd->kgn", q[t].reshape(kvh, g, d), k) * scale
        e = np.exp(sc - sc.max(-1, keepdims=True))
        ref[t] = (np.einsum("kgn,nkd->kgd", e, v) / e.sum(-1, keepdims=True)).reshape(heads, d)
    out = _poisoned(q.shape, dt)
    chunk_attention(_dev(q, dt), _dev(kc, dt), _dev(vc, dt), cupy.asarray(seq_of),
                    cupy.asarray(pos), scale, out, dt)
    got = _host(out, dt)
    err = rel(got, ref)
    record("row_kernels", f"chunk_attention {dt} {heads}/{kvh} d{d}", f"{err:.1e}")
    assert not np.isnan(got).any() and err <= TOL[dt]
