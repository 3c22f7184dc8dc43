"""An attention core and its output projection in one streamed kernel
(``partition-units{attention_o}``, issue 24): the ``attn_units`` op as the kernel's attention
phase, each CTA signalling once, the projection's producer streaming its first weight stages
meanwhile and waiting for every CTA's signal before it copies ``o_flat``. What the pass makes,
``simulate(lower(g)) ≈ interpret(g)`` over head configurations, lengths, batches, virtual grids
and interleavings (hypothesis), the missing wait and fence reported by name, where the fusion
does not apply, and NVRTC builds without spills."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fusionc.errors import SimulationError, VerifyError
from fusionc.interp import interpret
from fusionc.ir import print_module
from fusionc.ir.nodes import Module
from fusionc.ir.verifier import verify_module
from fusionc.passes import run_pipeline
from fusionc.passes.stream import v2_pipeline
from fusionc.sim import simulate
from fusionc.sim.simulator import simulate_kernel
from tests.passes.graphs import inputs, rel_err
from tests.passes.test_attention_v2 import TOL, UNFUSED, block


def FUSED(max_batch, rows=64):
    """The v2 pipeline with the attention block in one kernel where it fits."""
    return v2_pipeline(max_batch, rows=rows).replace("}", ", attention_o=true}", 1)


def ONLY_O(max_batch, rows=64):
    """The v2 pipeline with the attention units and the output projection in one kernel, the
    QKV projection in its own."""
    return v2_pipeline(max_batch, rows=rows).replace(
        "}", ", attention_o=true, attention_qkv=false}", 1)


def _fused(low):
    return next(g for g in low.graphs if g.kind == "kernel" and
                any(o.name == "attn_units" for o in g.body))


def test_the_core_and_its_output_projection_share_one_kernel():
    m = block(hidden=256, heads=8, kv_heads=2, head_dim=32, max_seq=96)
    low = run_pipeline(m, ONLY_O(8))
    host = low["attention"]
    assert [op.name for op in host.body] == ["launch"] * 2
    qkv, fused = host.body
    assert [v.name for v in fused.results] == ["o_flat", "k_cache.1", "v_cache.1", "0"]
    assert [v.name for v in fused.operands][:5] == ["qkv", "k_cache", "v_cache", "positions",
                                                    "seq_lens"]
    k = low[fused.attr("kernel").name]
    assert [op.name for op in k.body] == ["acc_alloc", "attn_units", "ring_alloc", "units"]
    att = k.body[1]
    assert att.attr("signal") == "attn" and att.attr("grid") == k.attr("grid") == 132
    assert k.body[3].attr("count") == 8   # the projection's units: the other CTAs idle there
    wait, fence, claim, issue = k.body[3].regions[0][:4]
    assert (wait.name, wait.attr("scale"), wait.attr("slot"), wait.attr("reset"),
            wait.attr("warp")) == ("counter_wait", "grid", "const", "exit", "producer")
    assert (fence.name, claim.name, issue.name) == ("fence_proxy_async", "ring_claim",
                                                    "ring_issue")
    assert issue.operands[2].name == "o_flat"
    text = print_module(low)
    assert 'signal = "attn"' in text and "scale = grid" in text
    for off in (UNFUSED(8), v2_pipeline(8)):   # off by default until measured on a GPU
        assert [op.name for op in run_pipeline(m, off)["attention"].body] == ["launch"] * 3


CONFIGS = st.fixed_dictionaries({
    "dtype": st.sampled_from(["f16", "bf16"]),
    "heads_kv": st.sampled_from([(8, 2), (4, 4), (12, 4), (8, 1), (36, 2)]),
    "head_dim": st.sampled_from([16, 32, 64]),
    "qk_norm": st.booleans(),
    "lens": st.lists(st.sampled_from([0, 1, 127, 128, 129, 200]), min_size=1, max_size=5),
    "grid": st.sampled_from([None, 1, 3, 8]),
    "whole": st.booleans(),   # the QKV projection in the kernel too
})


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIGS, st.integers(0, 2**31 - 1))
def test_simulate_fused_attention_matches_interpret(cfg, seed):
    heads, kvh = cfg["heads_kv"]
    m = block(cfg["dtype"], heads=heads, kv_heads=kvh, head_dim=cfg["head_dim"],
              hidden=256, max_seq=200, qk_norm=cfg["qk_norm"])
    low = run_pipeline(m, FUSED(8) if cfg["whole"] else ONLY_O(8))
    assert len(low["attention"].body) == (1 if cfg["whole"] else 2)
    rng = np.random.default_rng(seed)
    lens = cfg["lens"]
    args = inputs(m.graphs[0], len(lens), lens, rng)
    ref = interpret(m, args)
    out = _simulate(low, args, cfg["grid"], seed % 7, lazy=seed % 2 == 0)
    for a, r in zip(out, ref):
        assert rel_err(a, r) <= TOL[cfg["dtype"]]


def _simulate(low, args, grid=None, seed=0, lazy=False, kernel=None):
    """The graph of ``low``, launch by launch, each kernel (``kernel`` in place of the one of
    its name) on ``grid`` virtual CTAs with interleaving ``seed``: (y, k_cache, v_cache)."""
    env = dict(args)
    for op in low["attention"].body:
        k = low[op.attr("kernel").name]
        k = kernel if kernel is not None and kernel.name == k.name else k
        feed = {p.name: env[v.name] for p, v in zip(k.params, op.operands)}
        rows = len(args["seq_lens"])
        for p in k.params[len(op.operands):]:   # pure outputs: poisoned
            feed[p.name] = np.full([rows if isinstance(d, str) else d for d in p.type.shape],
                                   np.nan)
        out = simulate_kernel(k, feed, grid=grid, seed=seed, lazy_copies=lazy)
        env.update({r.name: out[v.name] for r, v in zip(op.results, k.outputs)})
    return tuple(env[v.name] for v in low["attention"].outputs)


def _without(k, names):
    """Kernel ``k`` with the ops named ``names`` taken out of its units region (unverified)."""
    body = list(k.body)
    units = body[-1]
    region = tuple(o for o in units.regions[0] if o.name not in names)
    return k.replace(body=tuple(body[:-1]) + (units.replace(regions=(region,)),))


def _case(pipeline=ONLY_O):
    m = block(hidden=256, heads=8, kv_heads=2, head_dim=32, max_seq=200)
    low = run_pipeline(m, pipeline(8))
    args = inputs(m.graphs[0], 3, [5, 0, 200], np.random.default_rng(3))
    return low, args


def test_a_read_of_o_before_every_cta_signalled_is_reported():
    low, args = _case()
    bad = _without(_fused(low), ("counter_wait", "fence_proxy_async"))
    with pytest.raises(VerifyError, match="no wait on every CTA's signal"):
        verify_module(Module(tuple(bad if g.name == bad.name else g for g in low.graphs)))
    with pytest.raises(SimulationError, match="o_flat"):
        for seed in range(8):   # some interleaving copies o_flat before its CTAs wrote it
            _simulate(low, args, grid=4, seed=seed, lazy=True, kernel=bad)


def test_a_wait_on_fewer_signals_than_ctas_is_reported():
    """The producer waiting for one signal, not one per CTA: some interleaving copies a row of
    o_flat that a CTA not yet signalled wrote (the attention phase yields after every unit)."""
    low, args = _case()
    k = _fused(low)
    units = k.body[-1]
    wait = units.regions[0][0]
    one = wait.replace(attrs=tuple((a, "one" if a == "scale" else v) for a, v in wait.attrs))
    bad = k.replace(body=k.body[:-1] + (units.replace(
        regions=((one,) + units.regions[0][1:],)),))
    caught = 0
    for seed in range(12):
        try:
            _simulate(low, args, grid=4, seed=seed, kernel=bad)
        except SimulationError as e:
            assert "o_flat" in str(e)
            caught += 1
    assert caught >= 3, caught


def test_an_epilogue_reading_o_flat_keeps_the_projection_apart():
    """y = o + o · W_oᵀ: every CTA's epilogue would read o_flat with plain loads."""
    import fusionc as fc

    @fc.graph
    def g(x: fc.f16["B", 64], w_qkv: fc.f16[128, 64], w_o: fc.f16[64, 64],
          k_cache: fc.f16["B", 80, 1, 32], v_cache: fc.f16["B", 80, 1, 32],
          positions: fc.i32["B"], seq_lens: fc.i32["B"]):
        q, k, v = fc.split(fc.linear(x, w_qkv), [64, 32, 32])
        q = fc.rope(fc.split_heads(q, 2), positions, 1e4)
        k = fc.rope(fc.split_heads(k, 1), positions, 1e4)
        kc, vc = fc.kv_cache_append(k_cache, v_cache, k, fc.split_heads(v, 1), positions)
        of = fc.merge_heads(fc.decode_attention(q, kc, vc, seq_lens, 0.2))
        return of + fc.linear(of, w_o), kc, vc
    low = run_pipeline(g, FUSED(4))
    kernels = [k for k in low.graphs if k.kind == "kernel"]
    assert all(k.body[0].name != "attn_units" or len(k.body) == 1 for k in kernels)
    rng = np.random.default_rng(5)
    args = inputs(g.graphs[0], 2, [3, 80], rng)
    ref = interpret(g, args)
    assert all(rel_err(a, r) <= TOL["f16"] for a, r in zip(simulate(low, args), ref))


def test_a_tma_copy_of_o_without_the_proxy_fence_is_reported():
    low, args = _case()
    bad = _without(_fused(low), ("fence_proxy_async",))
    with pytest.raises(SimulationError, match="no proxy fence"):
        _simulate(low, args, grid=4, kernel=bad)


def test_the_whole_block_in_one_kernel_at_small_batch():
    """QKV phase (RMSNorm prologue, every group flush signalling 'qkv'), the attention phase
    waiting for all of them, then the output projection's phase."""
    low, args = _case(FUSED)
    launch, = low["attention"].body
    k = low[launch.attr("kernel").name]
    assert [op.name for op in k.body] == ["row_rms", "acc_alloc", "ring_alloc", "units",
                                          "attn_units", "units"]
    qkv_units, att = k.body[3], k.body[4]
    flush = next(o for o in qkv_units.regions[0] if o.name == "group_flush")
    groups = qkv_units.attr("count") // qkv_units.attr("group")
    assert (flush.attr("signal"), flush.attr("per")) == ("qkv", groups)
    assert (att.attr("wait"), att.attr("wait_target"), att.attr("signal")) == \
        ("qkv", groups, "attn")
    ref = interpret(block(hidden=256, heads=8, kv_heads=2, head_dim=32, max_seq=200), args)
    for grid, seed in ((None, 0), (5, 1), (12, 2)):
        out = _simulate(low, args, grid, seed, lazy=seed == 1)
        assert all(rel_err(a, r) <= TOL["f16"] for a, r in zip(out, ref))


def test_an_attention_phase_that_does_not_wait_for_the_qkv_flushes_is_reported():
    low, args = _case(FUSED)
    k = low[low["attention"].body[0].attr("kernel").name]
    att = k.body[4]
    bad_att = att.replace(attrs=tuple((a, "" if a == "wait" else 0 if a == "wait_target" else v)
                                      for a, v in att.attrs))
    bad = k.replace(body=k.body[:4] + (bad_att,) + k.body[5:])
    with pytest.raises(VerifyError, match="an attention phase reading %qkv"):
        verify_module(Module(tuple(bad if g.name == k.name else g for g in low.graphs)))
    with pytest.raises(SimulationError, match="qkv"):
        for seed in range(8):   # some interleaving reads qkv before its flushes
            _simulate(low, args, grid=4, seed=seed, lazy=True, kernel=bad)


def test_scale_grid_only_on_a_const_exit_wait():
    low, _ = _case()
    k = _fused(low)
    units = k.body[-1]
    wait = units.regions[0][0]
    bad = wait.replace(attrs=tuple((a, "step" if a == "slot" else v) for a, v in wait.attrs))
    k2 = k.replace(body=k.body[:-1] + (units.replace(
        regions=((bad,) + units.regions[0][1:],)),))
    with pytest.raises(VerifyError, match="scale = grid only with slot = const"):
        verify_module(Module(tuple(k2 if g.name == k.name else g for g in low.graphs)))


@pytest.mark.parametrize("why,kw,mb,launches", [
    ("head_dim 256: 128 threads", dict(head_dim=256, heads=4, kv_heads=2), 8, 3),
    ("f32: 128 threads", dict(head_dim=64, heads=4, kv_heads=2, dtype="f32"), 8, 3),
    ("16 rows: the whole block on 64-row tiles", dict(hidden=3072, heads=24, kv_heads=8,
                                                      head_dim=128, max_seq=1024,
                                                      dtype="bf16"), 16, 1),
    ("64 rows: no room for the QKV phase", dict(hidden=3072, heads=24, kv_heads=8,
                                                head_dim=128, max_seq=1024, dtype="bf16"),
     64, 2)])
def test_what_the_block_fuses_by_shared_memory(why, kw, mb, launches):
    """Units that need 128 threads stay a kernel of their own; where the whole block does not
    fit on the pipeline's 128-row tiles it takes 64-row tiles (a smaller ring), else the QKV
    projection stays apart."""
    kw = dict(dict(hidden=256, max_seq=96), **kw)
    low = run_pipeline(block(kw.pop("dtype", "f16"), **kw), FUSED(mb, rows=128 if mb > 8
                                                                  else 64))
    assert len(low["attention"].body) == launches, why
    if launches == 1:
        k = _fused(low)
        assert next(o for o in k.body if o.name == "ring_alloc").attr("rows") == 64


@pytest.mark.parametrize("dtype,kw,mb,rows,whole", [
    ("bf16", dict(hidden=3072, heads=24, kv_heads=8, head_dim=128), 1, 128, True),   # 3.2-3B
    ("bf16", dict(hidden=3072, heads=24, kv_heads=8, head_dim=128), 16, 128, True),
    ("f16", dict(hidden=2560, heads=32, kv_heads=8, head_dim=128, qk_norm=True), 8, 64, True),
    ("f16", dict(hidden=2048, heads=32, kv_heads=8, head_dim=64), 16, 64, True)])
def test_fused_attention_compiles_without_spills(dtype, kw, mb, rows, whole):
    """``whole``: the QKV projection fits too (at 16 rows of head_dim 128 on 64-row tiles: on
    128-row ones its RMSNorm prologue leaves no room for two stages)."""
    from fusionc.codegen.compile import compile_kernel
    low = run_pipeline(block(dtype, max_seq=1024, **kw), FUSED(mb, rows=rows))
    ck = compile_kernel(_fused(low))
    assert ck.spills == 0, ck.report()
    src = ck.source
    assert src.smem_bytes + 1024 <= 232448 and src.pdl and src.resident
    assert src.persistent_units == 132 and src.threads == 288
    assert "fc_counter_wait<false>(" in src.source and "1u * gridDim.x" in src.source
    assert "fc_consumer_sync<256>();   // every store of o is done" in src.source
    assert any(o.name == "row_rms" for o in _fused(low).body) == whole
    assert src.source.count("fc_counter_wait<false>(") == (2 if whole else 1)
    assert "__syncthreads" not in src.source.split("the attention units")[1]


def test_signal_on_a_units_kernel_of_its_own_is_a_named_verify_error():
    low = run_pipeline(block(hidden=256, heads=8, kv_heads=2, head_dim=32, max_seq=96),
                       UNFUSED(8))
    k = next(g for g in low.graphs if g.kind == "kernel" and g.body[0].name == "attn_units")
    att = k.body[0]
    bad = k.replace(body=(att.replace(attrs=tuple(
        (a, "attn" if a == "signal" else v) for a, v in att.attrs)),))
    with pytest.raises(VerifyError, match="signal and wait only in an attention phase"):
        verify_module(Module(tuple(bad if g.name == k.name else g for g in low.graphs)))


def test_autotuning_measures_the_block_in_one_kernel_and_a_stored_choice_takes_it(
        tmp_path, monkeypatch):
    """The fused paths of an attention graph come with and without the block in one kernel;
    a stored choice with ``fuse`` compiles to one launch (older stored choices, without the
    key, to three)."""
    import json
    import fusionc as fc
    from fusionc.tune import store
    from fusionc.tune.search import V2Choice, candidates
    m = block(hidden=256, heads=8, kv_heads=2, head_dim=32, max_seq=96)
    g = m.graphs[0]
    cands = candidates(g, 4)
    assert V2Choice("fused", True, True) in cands and V2Choice("fused", True) in cands
    assert [c for c in cands if c.path == "mixed"] == [V2Choice("mixed", False)]
    assert "attention block in one kernel" in V2Choice("wide", True, True).describe()
    monkeypatch.setenv("FUSIONC_CACHE_DIR", str(tmp_path))   # the store lies beside the cubins
    for fuse, launches in ((True, 1), (None, 3)):
        choice = {"path": "fused", "chain": True, **({"fuse": fuse} if fuse else {})}
        store.record(g, 4, 96, dict(choice, us=1.0, candidates=2), gpu=store.DEFAULT_GPU)
        fn = fc.compile(m, max_batch=4, kv_len=96)
        assert [op.name for op in fn.host.body] == ["launch"] * launches, choice
    assert json.loads((tmp_path / "autotune.json").read_text())


def test_a_plain_read_of_o_flat_in_the_next_phase_is_a_named_verify_error():
    """The projection's tiles read o_flat with plain loads instead of the ring's stage (no
    acquire of the attention's stores), and o_flat as an epilogue operand."""
    low, _ = _case()
    k = _fused(low)
    units = k.body[-1]
    o = next(op for op in k.body if op.name == "attn_units").operands[5]
    for name, bad_op, match in (
            ("acc_gemv", lambda op: op.replace(operands=(op.operands[0], o) + op.operands[2:]),
             "a plain read of the attention units' output"),
            ("group_flush", lambda op: op.replace(operands=op.operands[:2] + (o,)),
             "a kernel input the kernel does not write")):
        region = tuple(bad_op(op) if op.name == name else op for op in units.regions[0])
        bad = k.replace(body=k.body[:-1] + (units.replace(regions=(region,)),))
        with pytest.raises(VerifyError, match=match):
            verify_module(Module(tuple(bad if g.name == k.name else g for g in low.graphs)))
