"""Multi-head latent attention (examples/deepseek_v2_lite.py, small sizes) in the interpreter
against a float64 reference written from DeepSeek-V2's equations in the *non-absorbed* form
(arXiv 2405.04434, §2.1.2-2.1.3: per-head keys [W_UK c ; k_R] and values W_UV c), over several
decode steps that fill the latent cache."""
import math
from pathlib import Path

import numpy as np
import pytest

import fusionc as fc
from fusionc.dsl.loader import load_file
from fusionc.interp.numerics import relative_error, round_to
from fusionc.ir.types import DType
from tests.reference.mla import query, rms_norm, rope_interleaved

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "deepseek_v2_lite.py"
S = dict(hidden=64, heads=4, qk_nope=16, qk_rope=8, v_head=12, kv_lora=32, max_seq=10,
         eps=1e-6, theta=10000.0)


def reference_step(w, xs, t):
    """Output of decode step t (token t attends over tokens 0..t), non-absorbed MLA."""
    H, dn, dr, L = S["heads"], S["qk_nope"], S["qk_rope"], S["kv_lora"]
    hs = [rms_norm(x, w["attn_norm"], S["eps"]) for x in xs[: t + 1]]
    cs = [rms_norm(h @ w["w_kv_a"][:L].T, w["kv_norm"], S["eps"]) for h in hs]       # c_KV,s
    krs = [rope_interleaved(h @ w["w_kv_a"][L:].T, s, S["theta"]) for s, h in enumerate(hs)]
    q = query(w, hs[t], S["eps"]).reshape(H, dn + dr)
    q_nope, q_rope = q[:, :dn], rope_interleaved(q[:, dn:], t, S["theta"])
    o = []
    for h in range(H):
        w_uk, w_uv = w["w_uk_t"][h].T, w["w_uv"][h]                 # [dn, L], [dv, L]
        k = np.stack([np.concatenate([w_uk @ c, kr]) for c, kr in zip(cs, krs)])
        v = np.stack([w_uv @ c for c in cs])
        s = k @ np.concatenate([q_nope[h], q_rope[h]]) / math.sqrt(dn + dr)
        p = np.exp(s - s.max())
        o.append(p @ v / p.sum())
    return xs[t] + np.concatenate(o) @ w["w_o"].T


@pytest.mark.parametrize("dtype,precise,tol,q_lora", [("f32", True, 1e-6, 0),
                                                       ("bf16", False, 1e-2, 0),
                                                       ("f32", True, 1e-6, 24)])
def test_absorbed_decode_matches_the_non_absorbed_equations(dtype, precise, tol, q_lora):
    """q_lora > 0: the compressed query of DeepSeek-V3 (eqs. 12-13)."""
    m = load_file(EXAMPLE, **S, dtype=dtype, q_lora=q_lora)
    g = m["attention"]
    rng = np.random.default_rng(0)
    w = {p.name: rng.standard_normal(p.type.shape) / math.sqrt(p.type.shape[-1])
         for p in g.params if p.type.rank and "B" not in p.type.shape}
    for n in [p.name for p in g.params if p.name.endswith("norm")]:
        w[n] = 1 + 0.1 * rng.standard_normal(w[n].shape)
    # the reference sees the weights and inputs as the model stores them; f32 with float64
    # arithmetic (precise) leaves only the f32 storage of the cache between steps
    w = {k: round_to(v, DType(dtype)).astype(np.float64) for k, v in w.items()}
    xs = [round_to(rng.standard_normal(S["hidden"]), DType(dtype)).astype(np.float64)
          for _ in range(6)]
    cache = np.zeros((1, S["max_seq"], S["kv_lora"] + S["qk_rope"]))
    for t in range(6):
        out, cache = fc.interpret(m, {**w, "x": xs[t][None], "cache": cache,
                                      "positions": np.array([t], np.int32),
                                      "seq_lens": np.array([t + 1], np.int32)},
                                  precise=precise)
        assert relative_error(out[0], reference_step(w, xs, t)) <= tol, t


def test_mla_ops_check_their_operands():
    from fusionc.errors import DSLError
    T = fc.f16
    with pytest.raises(DSLError, match="k_rope"):
        fc.trace(lambda c, a, b, p: fc.latent_cache_append(c, a, b, p), name="app", inputs={
            "c": T["B", 8, 40], "a": T["B", 32], "b": T["B", 4], "p": fc.i32["B"]})
    with pytest.raises(DSLError, match="heads, out, in"):
        fc.trace(lambda x, w: fc.head_linear(x, w), name="hl", inputs={"x": T["B", 4, 8],
                                                            "w": T[4, 8, 9]})
