"""MLA's absorbed W_UK and W_UV as block-diagonal v2 linear kernels (issue 27,
``fusionc.lower.match_heads``): what ``partition-units`` makes of them, the chain of W_UV and
the output projection, w_q and w_kv_a as sibling phases of one kernel, ``simulate(lower(g)) ≈ interpret(g)`` over random sizes, the forms that
stay on the host, the verifier's named errors and the tensor maps' row views."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fusionc as fc
from fusionc.errors import VerifyError
from fusionc.interp import interpret
from fusionc.ir import verify_module
from fusionc.passes import run_pipeline
from fusionc.passes.stream import v2_pipeline
from fusionc.sim import simulate
from tests.passes.graphs import inputs, rel_err
from tests.passes.test_mla_v2 import TOL, block as small_block


def block(dtype="bf16", **kw):
    """test_mla_v2's block with heads of 64 (W_UV) and 128 (W_UK) rows and K of whole tiles
    (W_UK: nope 128, W_UV: latent 128)."""
    return small_block(dtype, **{"qk_nope": 128, "v_head": 64, "kv_lora": 128, **kw})


def gemv_of(k):
    return next(o for u in k.body if u.name == "units" for o in u.regions[0]
                if o.name == "acc_gemv")


def test_w_uk_and_w_uv_become_block_diagonal_kernels():
    low = run_pipeline(block(), "fold-views,partition-units{max_batch=4, chain=false, "
                                "siblings=false}")
    host = low["attention"]
    assert [op.name for op in host.body] == ["launch"] * 6   # no host op is left
    uk, uv = host.body[2], host.body[4]
    assert [v.name for v in uk.operands] == ["q", "w_uk_t"]           # q itself: no views
    assert [v.name for v in uv.operands] == ["o_latent", "w_uv"]
    assert [v.name for v in uv.results] == ["o_flat"]                  # merge_heads absorbed
    g_uk, g_uv = gemv_of(low[uk.attr("kernel").name]), gemv_of(low[uv.attr("kernel").name])
    assert (g_uk.attr("n"), g_uk.attr("k"), g_uk.attr("head_rows"), g_uk.attr("head_cols")) \
        == (3 * 128, 128, 128, 144)     # q = [q_nope | q_pe] per head: 128 + 16 columns
    assert (g_uv.attr("n"), g_uv.attr("k"), g_uv.attr("head_rows"), g_uv.attr("head_cols")) \
        == (3 * 64, 128, 64, 128)


def test_w_uv_and_the_output_projection_chain_above_8_rows():
    low = run_pipeline(block(), v2_pipeline(16))
    host = low["attention"]
    assert [op.name for op in host.body] == ["launch"] * 4
    k = low[host.body[3].attr("kernel").name]
    phases = [u for u in k.body if u.name == "units"]
    assert len(phases) == 2
    heads = [next(o for o in u.regions[0] if o.name == "acc_gemv").attr("head_rows")
             for u in phases]
    assert heads == [64, 0]


def test_w_q_and_w_kv_a_are_sibling_phases_without_waits():
    low = run_pipeline(block(), v2_pipeline(4))
    host = low["attention"]
    first = host.body[0]
    assert [v.name for v in first.operands] == ["x", "attn_norm", "w_q", "w_kv_a"]
    assert [v.name for v in first.results] == ["q", "kv_a"]
    k = low[first.attr("kernel").name]
    assert [op.name for op in k.body].count("row_rms") == 1
    phases = [u for u in k.body if u.name == "units"]
    assert len(phases) == 2
    for u in phases:
        names = [o.name for o in u.regions[0]]
        assert "counter_wait" not in names
        issue = next(o for o in u.regions[0] if o.name == "ring_issue")
        gemv = next(o for o in u.regions[0] if o.name == "acc_gemv")
        assert issue.operands[2].name == "x" and len(gemv.operands) == 5   # the norm
    alone = run_pipeline(block(), "fold-views,partition-units{max_batch=4, siblings=false}")
    assert len(alone["attention"].body) == 5


def test_head_tiles_of_64_rows_under_the_wide_path():
    """A 64-row head under 128-row tiles: that kernel takes 64-row tiles."""
    low = run_pipeline(block(), v2_pipeline(4, rows=128))
    host = low["attention"]
    rows = [gemv_of(low[op.attr("kernel").name]).attr("rows") for op in host.body
            if any(u.name == "units" for u in low[op.attr("kernel").name].body)]
    assert rows == [128, 128, 64, 128]   # w_q and w_kv_a, W_UK, W_UV, w_o


CONFIGS = st.fixed_dictionaries({
    "heads": st.sampled_from([1, 2, 5, 16]),
    "nope_v": st.sampled_from([(128, 64), (128, 128), (256, 64)]),
    "latent": st.sampled_from([128, 256]),
    "dtype": st.sampled_from(["f16", "bf16", "f32"]),
    "lens": st.lists(st.integers(0, 150), min_size=1, max_size=3),
    "rows": st.sampled_from([4, 16]),
})


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIGS, st.integers(0, 2**31 - 1))
def test_simulated_head_kernels_match_interpret(cfg, seed):
    nope, v = cfg["nope_v"]
    m = block(cfg["dtype"], heads=cfg["heads"], qk_nope=nope, v_head=v, kv_lora=cfg["latent"])
    lens = cfg["lens"]
    args = inputs(m.graphs[0], len(lens), lens, np.random.default_rng(seed))
    low = run_pipeline(m, v2_pipeline(cfg["rows"]))
    assert "head_linear" not in [op.name for op in low["attention"].body]
    for a, r in zip(simulate(low, args), interpret(m, args)):
        assert rel_err(a, r) <= TOL[cfg["dtype"]]


def test_other_forms_stay_on_the_host():
    """A head of 16 rows (W_UV with v_head 16) has no 64-row tile, and a K of 16 (W_UK with
    nope 16) would be a tail tile: host GEMMs."""
    low = run_pipeline(block(v_head=16), "fold-views,partition-units{max_batch=4}")
    names = [op.name for op in low["attention"].body]
    assert names == ["launch"] * 3 + ["head_linear", "reshape", "launch"]
    low = run_pipeline(block(qk_nope=16), "fold-views,partition-units{max_batch=4}")
    names = [op.name for op in low["attention"].body]
    assert names == ["launch", "reshape", "split", "head_linear", "launch", "launch"]
    T = fc.bf16

    @fc.graph
    def g(x: T["B", 2, 128], w: T[2, 64, 128]):
        return fc.head_linear(x * x, w)    # x·x is no kernel's output: the host computes it
    low = run_pipeline(fc.module(g), "fold-views")
    from fusionc.lower.match_heads import head_kernels
    assert len(head_kernels(low.graphs[0])) == 1


def test_the_verifier_names_bad_head_attributes():
    low = run_pipeline(block(), "fold-views,partition-units{max_batch=4}")
    host = low["attention"]
    name = host.body[1].attr("kernel").name
    k = low[name]
    gemv = gemv_of(k)

    def with_attrs(**kw):
        attrs = tuple((a, kw.get(a, v)) for a, v in gemv.attrs)
        units = next(u for u in k.body if u.name == "units")
        body = tuple(o.replace(attrs=attrs) if o is gemv else o for o in units.regions[0])
        new = k.replace(body=tuple(units.replace(regions=(body,)) if u is units else u
                                   for u in k.body))
        from fusionc.ir import Module
        return Module(tuple(new if x.name == name else x for x in low.graphs))
    with pytest.raises(VerifyError, match="head_rows dividing n"):
        verify_module(with_attrs(head_rows=96))
    with pytest.raises(VerifyError, match="heads"):
        verify_module(with_attrs(head_cols=200))


def test_tensor_maps_view_weights_and_activations_as_rows():
    from fusionc.codegen.streamed import _params
    from fusionc.codegen.streamed import plan as stream_plan
    low = run_pipeline(block(), v2_pipeline(4))
    host = low["attention"]
    k = low[host.body[1].attr("kernel").name]
    maps = {p.value.name: p.lead for p in _params(k, stream_plan(k)) if p.kind == "tensormap"}
    assert maps == {"w_uk_t": 2, "q": 1}


def test_a_compressed_query_lowers_on_v2_by_default_and_matches_interpret():
    """DeepSeek-V3's q = w_q_b · rms_norm(w_q_a · h): v1's stage matcher has no such query,
    so the default is v2 at any size; the norm is the prologue of w_q_b's kernel."""
    m = block(q_lora=64)
    g = m.graphs[0]
    low = run_pipeline(m, v2_pipeline(4))
    assert [op.name for op in low["attention"].body] == ["launch"] * 6   # w_q_a with w_kv_a
    args = inputs(g, 3, [5, 0, 100], np.random.default_rng(2))
    for a, r in zip(simulate(low, args), interpret(m, args)):
        assert rel_err(a, r) <= TOL["bf16"]


def test_bad_inputs_get_named_errors_or_empty_results():
    """Found by an attack on the new paths: batch 0 in the simulator, a head_linear result
    viewed as another rank-2 shape, head attributes of a lowered kernel that do not fit."""
    from fusionc.errors import LoweringError
    T = fc.bf16

    @fc.graph
    def lin(x: T["B", 128], w: T[64, 128]):
        return fc.linear(x, w)
    out = simulate(run_pipeline(fc.module(lin), v2_pipeline(4)),
                   {"x": np.zeros((0, 128)), "w": np.ones((64, 128))})
    assert out[0].shape == (0, 64)

    @fc.graph
    def other_view(x: T[3, 2, 128], w: T[2, 64, 128]):
        return fc.reshape(fc.head_linear(x, w), 6, 64)
    with pytest.raises(LoweringError, match="'reshape': a view"):
        run_pipeline(fc.module(other_view), v2_pipeline(4))

    @fc.graph
    def odd(x: T["B", 2, 128], w: T[2, 96, 128]):
        return fc.head_linear(x, w)
    with pytest.raises(LoweringError, match="head_linear no block-diagonal kernel takes"):
        run_pipeline(fc.module(odd), v2_pipeline(4))

    low = run_pipeline(block(), v2_pipeline(4))   # stage-view form: checked against ring_issue
    name = low["attention"].body[1].attr("kernel").name
    from fusionc.ir import Module
    k = low[name]
    units = next(u for u in k.body if u.name == "units")
    for bad in (768, 96):
        body = tuple(o.replace(attrs=tuple((a, bad if a == "head_rows" else v) for a, v in o.attrs))
                     if o.name == "acc_gemv" else o for o in units.regions[0])
        new = k.replace(body=tuple(units.replace(regions=(body,)) if u is units else u
                                   for u in k.body))
        with pytest.raises(VerifyError, match="head_rows"):
            verify_module(Module(tuple(new if x.name == name else x for x in low.graphs)))
