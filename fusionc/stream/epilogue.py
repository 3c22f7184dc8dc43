"""The epilogue of a streamed linear's ``group_flush``: steps applied to each output element in
fp32 between the split-K sum and the store, defined once for the simulator and codegen.

A group's tile holds ``rows`` weight rows. Without ``silu_mul`` output column ``n = g·rows + r``
is tile row ``r``. With ``silu_mul`` (a *paired* tile, ``acc_gemv {split = I}``) the first half
of the tile holds gate rows ``[g·rows/2, +rows/2)`` and the second half the matching up rows
``I + g·rows/2 + r``: output column ``n = g·rows/2 + r`` is ``silu(gate) · up`` (SwiGLU,
Shazeer 2020, "GLU Variants Improve Transformer", eq. 6).

Steps, in the order given (``epilogue = "bias,silu_mul,add"``), each with its operand:

``bias`` (``%b: [N]``, weight-row indexed)   v + b[weight row]
``silu`` (none)                               v · sigmoid(v)
``silu_mul`` (none)                           silu(gate) · up: ends the weight-row steps
``add``  (``%t: [B, N]``)                     v + t[b, n]   (a residual)
``mul``  (``%t: [B, N]``)                     v · t[b, n]
``round_f16``, ``round_bf16`` (none)          v rounded to that dtype, where the graph rounds
                                              an op's result before the next op reads it

(An RMSNorm before the linear is not a step: ``acc_gemv`` applies it to the activations.)
"""
from __future__ import annotations

import numpy as np

STEPS = {"bias": 1, "silu": 0, "silu_mul": 0, "add": 1, "mul": 1, "round_f16": 0,
         "round_bf16": 0}
ROW_STEPS = ("bias",)                # weight-row indexed: only before silu_mul


def parse(text: str) -> tuple[str, ...]:
    """The steps of an ``epilogue`` attribute (``""``: none)."""
    return tuple(s.strip() for s in text.split(",") if s.strip())


def problem(steps: tuple[str, ...]) -> str | None:
    """Why ``steps`` is not a valid epilogue, or None."""
    bad = [s for s in steps if s not in STEPS]
    if bad:
        return f"unknown step {bad[0]!r}"
    if steps.count("silu_mul") > 1 or steps.count("bias") > 1:
        return "silu_mul and bias at most once each"
    if "silu_mul" in steps:
        at = steps.index("silu_mul")
        late = [s for s in steps[at:] if s in ROW_STEPS]
        if late:
            return f"{late[0]} after silu_mul (it is indexed by weight rows)"
        early = [s for s in steps[:at] if s not in ROW_STEPS and not s.startswith("round_")]
        if early:
            return f"{early[0]} before silu_mul (only bias and round_* act on the gate/up rows)"
    return None


def operands(steps: tuple[str, ...]) -> int:
    """Extra operands of ``group_flush`` the steps take, in order."""
    return sum(STEPS[s] for s in steps)


def paired(steps: tuple[str, ...]) -> bool:
    return "silu_mul" in steps


def _silu(v):
    with np.errstate(over="ignore"):
        return v / (1 + np.exp(-v))


def apply(steps, tile: np.ndarray, extras: list, g: int, rows: int, split: int,
          ncols: int) -> np.ndarray:
    """The simulator's epilogue: ``tile`` f32 ``[B, rows]`` (the group's summed partials) →
    ``(values [B, width], n0)``: output columns ``[n0, n0 + width)`` of group ``g``, clipped
    to ``ncols``.
    ``extras`` are the step operands' arrays, in step order."""
    ops = iter(extras)
    half = rows // 2 if paired(steps) else rows
    n0 = g * half
    width = max(0, min(half, ncols - n0))
    wrow = np.arange(rows) + g * rows            # weight row of each tile row
    if paired(steps):
        wrow = np.concatenate([n0 + np.arange(half), split + n0 + np.arange(half)])
    v = tile.astype(np.float32)
    for s in steps:
        if s.startswith("round_"):
            from fusionc.interp.numerics import round_to
            from fusionc.ir.types import DType
            v = np.asarray(round_to(v, DType(s[6:])), np.float32)
        elif s == "bias":
            b = np.asarray(next(ops), np.float32)
            v = v + np.where(wrow < b.shape[0], b[np.minimum(wrow, b.shape[0] - 1)], 0)
        elif s == "silu":
            v = _silu(v)
        elif s == "silu_mul":
            v = _silu(v[:, :half]) * v[:, half:]
        else:
            t = np.asarray(next(ops), np.float32)[:v.shape[0], n0:n0 + width]
            v = v[:, :width]
            v = v + t if s == "add" else v * t
    return v[:, :width], n0


def c_struct(steps, ctype_y: str, ctypes: list[str], split: int, name: str = "FcEpi") -> str:
    """The C++ epilogue functor of one flush: ``put(b, r, v)`` (unpaired) or
    ``put2(b, r, gate, up)`` (paired) stores output element ``(b, n0 + r)``; the flush helpers
    of ``templates/lib/stream.cuh.j2`` call them. Fields: ``y``, ``o0..`` (step operands, in
    order), ``N`` (output columns), ``M`` (batch rows), ``n0`` (the group's first column).
    ``name``: the struct's name (one per phase of a kernel)."""
    fields = []
    for i, s in enumerate(s for s in steps if STEPS[s]):
        fields.append(f"const {ctypes[i]}* o{i};")
    pre, post, seen_pair = [], [], False
    i = 0
    for s in steps:
        if s == "silu_mul":
            seen_pair = True
            continue
        if s.startswith("round_"):
            from fusionc.codegen.cnames import ctype
            from fusionc.ir.types import DType
            code = f"v = fc_f32(fc_to<{ctype(DType(s[6:]))}>(v));"
        elif s == "bias":
            code = "v += fc_f32(o{i}[wr]);"
        elif s == "silu":
            code = "v = v / (1.0f + expf(-v));"
        elif s == "add":
            code = "v += fc_f32(o{i}[(long long)b * N + n]);"
        else:
            code = "v *= fc_f32(o{i}[(long long)b * N + n]);"
        (post if seen_pair else pre).append(code.format(i=i))
        i += STEPS[s]
    head = (f"  {ctype_y}* y;\n  " + "\n  ".join(fields) + "\n  int N, M, n0;\n")
    store = "    y[(long long)b * N + n] = fc_to<" + ctype_y + ">(v);\n"
    guard = "    const int n = n0 + r;\n    if (b >= M || n >= N) return;\n"
    if not paired(steps):
        body = ("  FC_DEVICE void put(int b, int r, float v) const {\n" + guard +
                "    const int wr = n;\n    (void)wr;\n" +
                "".join(f"    {c}\n" for c in pre) + store + "  }\n")
        body += "  FC_DEVICE void put2(int, int, float, float) const {}  // paired tiles only\n"
        return f"struct {name} {{\n  static constexpr bool PAIR = false;\n" + head + body + "};"
    row = "".join(f"      {c}\n" for c in pre)
    body = ("  FC_DEVICE float row(int b, int wr, float v) const {\n" + row.replace("      ", "    ")
            + "    return v;\n  }\n"
            "  FC_DEVICE void put2(int b, int r, float g, float u) const {\n" + guard +
            f"    g = row(b, n, g);\n    u = row(b, {split} + n, u);\n"
            "    float v = (g / (1.0f + expf(-g))) * u;\n" +
            "".join(f"    {c}\n" for c in post) + store + "  }\n")
    body += "  FC_DEVICE void put(int, int, float) const {}  // unpaired tiles only\n"
    return f"struct {name} {{\n  static constexpr bool PAIR = true;\n" + head + body + "};"


def norm_activations(x: np.ndarray, r: np.ndarray, gamma: np.ndarray, dtype) -> np.ndarray:
    """``acc_gemv``'s RMSNorm of activation tile ``x`` [B, C] (rows' 1/rms ``r`` [B, 1], weight
    ``gamma`` [C]) in ``dtype``: f16 ``round(round(x · round(r)) · gamma)`` (two packed f16
    multiplies on the GPU), bf16 and f32 ``round(x · r · gamma)`` (bf16 keeps fp32 arithmetic:
    three roundings of 8-bit mantissas would cost ~1%)."""
    from fusionc.interp.numerics import round_to
    from fusionc.ir.types import DType
    f = lambda v: np.asarray(round_to(v, dtype), np.float32)   # noqa: E731
    if dtype == DType.f16:
        return f(f(x * f(r)) * gamma)
    return f(x * r * gamma)
