"""Lowering v2's host attention (the mixed path with ``attention-units{host=true}``): decode
attentions the attention units do not take — another block form, a head_dim past their
registers, f32 past 192 — stay in the host graph as RoPE, KV append and decode attention, run
by ``fusionc.runtime.library_attention``'s kernels. ``simulate(lower(g)) ≈ interpret(g)`` at
several batches and lengths (0 and full included), the pipeline v2's default picks, what
``fusionc ir --after attention-units`` shows, and the in-place append's named refusal."""
# no `from __future__ import annotations`: the DSL evaluates the annotations
import re

import numpy as np
import pytest

from fusionc.interp import interpret
from fusionc.ir import parse_module, print_module
from fusionc.models.blocks import attention_block
from fusionc.passes import run_pipeline
from fusionc.runtime.pipelines import v2_default_pipeline
from fusionc.sim import simulate
from tests.passes.graphs import inputs, rel_err

TOL = {"f16": 2e-3, "f32": 1e-4}


def _block(dtype="f16", **kw):
    sizes = dict(hidden=128, heads=4, kv_heads=2, head_dim=32, max_seq=48)
    sizes.update(kw)
    return attention_block(eps=1e-5, theta=1e4, dtype=dtype, **sizes)


def _swapped():
    """The block with decode_attention reading the appended V cache as K and K as V."""
    text = re.sub(r"decode_attention\(%(\S+), %(\S+), %(\S+),", r"decode_attention(%\1, %\3, %\2,",
                  print_module(_block()))
    return parse_module(text)


def _attention_only():
    from tests.gpu.compiled_cases import attention_only
    return attention_only(hidden=128, heads=4, kv_heads=2, head_dim=32, max_seq=48)


CASES = {
    "head_dim 272": lambda: _block(head_dim=272),
    "f32 head_dim 208": lambda: _block("f32", head_dim=208),
    "swapped caches": _swapped,
    "attention output, no O projection": _attention_only,
}


@pytest.mark.parametrize("rows", [1, 3, 40])
@pytest.mark.parametrize("case", sorted(CASES))
def test_host_attention_matches_the_interpreter(case, rows):
    m = CASES[case]()
    g = m.graphs[0]
    pipe = v2_default_pipeline(g, rows)
    assert "host=true" in pipe and pipe.endswith("lower-library")
    low = run_pipeline(m, pipe)
    names = [op.name for op in low[g.name].body]
    assert {"rope", "kv_cache_append", "decode_attention"} <= set(names)
    assert "linear" not in names   # GEMMs (library_call)
    rng = np.random.default_rng(rows)
    lens = rng.integers(0, 49, rows)
    lens[0] = 48 if rows > 1 else 0   # a full row and an empty one
    if rows > 2:
        lens[1] = 0
    args = inputs(g, rows, lens.tolist(), rng)
    dt = "f32" if "f32" in case else "f16"
    for a, r in zip(simulate(low, args), interpret(m, args)):
        assert rel_err(a, r) <= TOL[dt]


def test_units_keep_the_cores_they_take_beside_host_attentions():
    """Two attentions in one graph: the one the units take becomes an attn_units launch, the
    one they do not (head_dim 272) stays on the host."""
    a, b = _block().graphs[0], _block(head_dim=272).graphs[0]
    from fusionc.lower.attention_v2 import attention_cores, takes
    assert [takes(c) for c in attention_cores(a)] == [True]
    assert [takes(c) for c in attention_cores(b)] == [False]
    low = run_pipeline(_block(), "fold-views,attention-units{max_batch=4,host=true}")
    assert "attn_units(" in print_module(low) and "decode_attention(" not in print_module(low)
    low = run_pipeline(_block(head_dim=272),
                       "fold-views,attention-units{max_batch=4,host=true}")
    text = print_module(low)
    assert "attn_units(" not in text and "decode_attention(" in text and "rope(" in text


def test_ir_after_attention_units_shows_the_host_attention(tmp_path, capsys):
    from fusionc.cli import main
    src = tmp_path / "g.py"
    src.write_text("from fusionc.models.blocks import attention_block\n"
                   "module = attention_block(hidden=128, heads=4, kv_heads=2, head_dim=272, "
                   "max_seq=48, eps=1e-5, theta=1e4, dtype='f16')\n")
    rc = main(["ir", str(src), "--passes",
               "fold-views,attention-units{max_batch=4,host=true},lower-library",
               "--after", "attention-units"])
    out = capsys.readouterr().out
    assert rc in (0, None) and "kv_cache_append(" in out and "decode_attention(" in out


def test_tuning_offers_only_the_host_attention_where_the_units_do_not_take_it():
    from fusionc.runtime.pipelines import path_pipeline
    from fusionc.tune.search import candidates
    g = _block(head_dim=272).graphs[0]
    assert [c.path for c in candidates(g, 4)] == ["mixed"]
    assert "host=true" in path_pipeline(g, 4, "mixed", None)
    assert "host=true" not in path_pipeline(_block().graphs[0], 200, "mixed", None)


def test_a_cache_read_beside_a_host_append_is_refused_on_every_path():
    """An append with no attention (the library path) that also returns the old cache: the
    host writes in place, so the old value would be the new one."""
    import fusionc as fc
    from fusionc.errors import LoweringError

    @fc.graph
    def g(kc: fc.f16["B", 8, 1, 16], vc: fc.f16["B", 8, 1, 16], k: fc.f16["B", 1, 16],
          v: fc.f16["B", 1, 16], pos: fc.i32["B"]):
        k2, v2 = fc.kv_cache_append(kc, vc, k, v, pos)
        return k2, v2, kc
    with pytest.raises(LoweringError, match="read beside its kv_cache_append") as e:
        fc.compile(g, max_batch=4)
    assert e.value.op == "kv_cache_append" and e.value.loc is not None
