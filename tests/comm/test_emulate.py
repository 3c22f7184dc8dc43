"""The emulated peer-to-peer all-reduce kernel (fusionc.comm.emulate) follows its protocol under
random interleavings of W ranks × CTAs and gives the bits of the interpreter's
all_reduce_add_rms_norm / all_reduce_add / all_reduce, one-shot and two-shot, for token counts
that do not divide into chunks, shards or CTAs."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusionc as fc
from fusionc.comm import emulate as em

T16 = fc.f16


def _graph(kind, ranks, D):
    if kind == "norm":
        @fc.graph
        def g(x: T16["B", D], residual: T16["B", D], w: T16[D]):
            return fc.rms_norm(residual + fc.all_reduce(x, ranks), w, 1e-5), \
                residual + fc.all_reduce(x, ranks)
        return g

    @fc.graph
    def g2(x: T16["B", D], residual: T16["B", D], w: T16[D]):
        s = fc.all_reduce(x, ranks)
        return (residual + s) if kind == "add" else s
    return g2


def _inputs(ranks, T, D, seed):
    rng = np.random.default_rng(seed)
    res = rng.standard_normal((T, D)).astype(np.float16)
    w = (1 + 0.1 * rng.standard_normal(D)).astype(np.float16)
    return [{"x": rng.standard_normal((T, D)).astype(np.float16), "residual": res, "w": w}
            for _ in range(ranks)]


def _check(kind, ranks, T, D, ctas, chunk, two_shot, seed):
    ins = _inputs(ranks, T, D, seed)
    want = fc.interpret(_graph(kind, ranks, D), ins)
    got = em.emulate([i["x"] for i in ins], None if kind == "ar" else ins[0]["residual"],
                     ins[0]["w"] if kind == "norm" else None, 1e-5, ctas=ctas, chunk=chunk,
                     two_shot=two_shot, seed=seed)
    for r in range(ranks):
        y, h = got[r]
        if kind == "norm":
            assert np.array_equal(y.astype(np.float16).view(np.uint16), want[r][0].view(np.uint16))
            assert np.array_equal(h.astype(np.float16).view(np.uint16), want[r][1].view(np.uint16))
        else:
            assert np.array_equal(h.astype(np.float16).view(np.uint16), want[r][0].view(np.uint16))
        assert np.array_equal(got[r][1], got[0][1])   # every rank holds the same bits


@pytest.mark.parametrize("two_shot", [False, True])
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("T", [1, 3, 37, 130])
def test_one_and_two_shot_equal_the_interpreter(two_shot, ranks, T):
    _check("norm", ranks, T, 32, ctas=3, chunk=4, two_shot=two_shot, seed=T)


@pytest.mark.parametrize("kind", ["ar", "add"])
def test_plain_and_add_variants(kind):
    _check(kind, 2, 9, 16, ctas=2, chunk=2, two_shot=True, seed=1)
    _check(kind, 2, 9, 16, ctas=2, chunk=2, two_shot=False, seed=2)


@settings(max_examples=25, deadline=None)
@given(ranks=st.sampled_from([2, 3, 4]), T=st.integers(1, 70), ctas=st.integers(1, 9),
       chunk=st.integers(1, 5), two_shot=st.booleans(), seed=st.integers(0, 2**16))
def test_protocol_under_random_schedules(ranks, T, ctas, chunk, two_shot, seed):
    _check("norm", ranks, T, 8, ctas, chunk, two_shot, seed)


def test_a_missing_signal_is_a_deadlock(monkeypatch):
    real = em._signal

    def lossy(st_, ctx, r, b, phase, k):
        if not (r == 1 and b == 0 and k >= 1):
            real(st_, ctx, r, b, phase, k)
    monkeypatch.setattr(em, "_signal", lossy)
    with pytest.raises(em.ProtocolError, match="deadlock"):
        em.emulate([np.ones((4, 8), np.float16)] * 2, ctas=2, chunk=1)


def test_reading_before_the_signal_is_caught(monkeypatch):
    monkeypatch.setattr(em, "_satisfied", lambda *a: True)   # waits that do not wait
    with pytest.raises(em.ProtocolError, match="read row"):
        for seed in range(20):
            em.emulate([np.ones((16, 8), np.float16)] * 2, ctas=2, chunk=1, seed=seed)


@settings(max_examples=25, deadline=None)
@given(ranks=st.sampled_from([2, 3]), ctas=st.integers(1, 5), seed=st.integers(0, 2**16),
       calls=st.lists(st.tuples(st.integers(1, 40), st.booleans(), st.sampled_from([1, 2, 4])),
                      min_size=2, max_size=5))
def test_slots_are_reused_safely_across_calls(ranks, ctas, seed, calls):
    """Consecutive calls with other token counts, algorithms and chunks: ranks drift apart,
    slots alternate by epoch parity, and no row is overwritten before its reader read it."""
    D = 8
    seq, want = [], []
    for n, (T, two, chunk) in enumerate(calls):
        ins = _inputs(ranks, T, D, seed + n)
        seq.append(em.Call([i["x"] for i in ins], ins[0]["residual"], ins[0]["w"], two, chunk))
        want.append(fc.interpret(_graph("norm", ranks, D), ins))
    got = em.emulate_calls(seq, 1e-5, ctas=ctas, seed=seed)
    for n in range(len(calls)):
        for r in range(ranks):
            assert np.array_equal(got[n][r][1].astype(np.float16), want[n][r][1])
            assert np.array_equal(got[n][r][0].astype(np.float16), want[n][r][0])


def test_reusing_a_slot_too_early_is_caught(monkeypatch):
    """With one slot instead of two (parity always 0), a fast rank overwrites rows that its
    slow peer has not read yet — the emulator must see it."""
    real_push, real_read = em._push, em._read

    def one_slot(f):
        def g(st_, ctx, *a, **k):
            return f(st_, dict(ctx, e=ctx["e"] * 2), *a, **k)   # every epoch even
        return g
    monkeypatch.setattr(em, "_push", one_slot(real_push))
    monkeypatch.setattr(em, "_read", one_slot(real_read))
    x = [np.ones((2, 4), np.float16)] * 2   # one chunk per CTA: no later chunk holds B back
    with pytest.raises(em.ProtocolError, match="before rank"):
        for seed in range(50):
            em.emulate_calls([em.Call(x, chunk=1)] * 4, ctas=2, seed=seed)
