"""Issue 26 item 9: C names of IR values are one-to-one, so names that differ only in ``.``
and ``_`` do not collide in the generated CUDA."""
import itertools

from hypothesis import given, strategies as st

import fusionc as fc
from fusionc.codegen import cnames

NAMES = ["w_down", "w.down", "w__down", "w_.down", "w._down", "w_Zddown", "w_ZZddown", "a_Z",
         "a.Z", "a_Zd", "a.d", "x.1", "x_1", "x", "_", ".", "__", "_Zx2e_", "a-b", "a_Zx2d_b"]


def test_tricky_names_do_not_collide():
    c = [cnames.ident("p", n) for n in NAMES]
    assert len(set(c)) == len(NAMES), [x for x in c if c.count(x) > 1]
    assert all(x.replace("_", "a").isalnum() for x in c)
    assert cnames.ident("v", "xt") == "v_xt" and cnames.ident("fusionc", "mlp_k0") == \
        "fusionc_mlp_k0"   # plain names keep their spelling


@given(st.lists(st.text(alphabet="ab_.Zdx-", max_size=6), min_size=2, max_size=8, unique=True))
def test_ident_is_injective(names):
    for a, b in itertools.combinations(names, 2):
        assert cnames.ident("v", a) != cnames.ident("v", b), (a, b)


def test_output_beside_a_parameter_of_the_same_c_spelling(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSIONC_CACHE_DIR", str(tmp_path))
    T = fc.f16

    @fc.graph
    def mlp(x: T["B", 256], mlp_norm: T[256], w_gate_up: T[1024, 256], w_down: T[256, 512]):
        h = fc.rms_norm(x, mlp_norm, 1e-5, name="h")
        gate, up = fc.split(fc.linear(h, w_gate_up), [512, 512], name=("gate", "up"))
        return fc.add(x, fc.linear(fc.silu_mul(gate, up), w_down), name="w.down")
    fn = fc.compile(mlp, max_batch=4)   # NVRTC: no duplicate parameter p_w_down
    (k,) = fn.kernels.values()
    assert "p_w_down" in k.source.source and "p_w_Zddown" in k.source.source
