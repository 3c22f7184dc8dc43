"""Float attributes against fp32, the type the generated CUDA computes them in.

IR text keeps any double (attributes round-trip exactly), but a value that is finite as a
double and overflows fp32 becomes inf on the GPU (NaN results), and a nonzero value below the
smallest fp32 subnormal becomes 0 (a dropped eps). The DSL and the compilers reject both here.
"""
from __future__ import annotations

import math

from fusionc.errors import VerifyError
from fusionc.ir.nodes import Graph, Module, Op
from fusionc.ir.registry import lookup

FP32_MAX = 3.4028234663852886e38        # the largest finite fp32
FP32_MIN_SUBNORMAL = 1.401298464324817e-45


def fp32_problem(v: float) -> tuple[str, str] | None:
    """(what is wrong, what is valid) when the double ``v`` does not survive as fp32."""
    if math.isfinite(v) and abs(v) > FP32_MAX:
        return f"{v!r} overflows fp32", f"|x| <= {FP32_MAX:.7g} (fp32 on the GPU)"
    if v != 0 and abs(v) < FP32_MIN_SUBNORMAL / 2:
        return f"{v!r} is 0 in fp32", f"0, or |x| >= {FP32_MIN_SUBNORMAL:.4g} (fp32 on the GPU)"
    return None


def check_fp32_op(op: Op) -> None:
    """VerifyError at ``op``'s location when one of its float attributes (``float`` or
    ``floats`` kinds, nested ops included) does not survive as fp32."""
    for o in op.walk():
        d = lookup(o.name)
        for name, value in o.attrs:
            spec = d.attr_spec(name) if d is not None else None
            if spec is None or spec.kind.name not in ("float", "floats"):
                continue
            for x in value if isinstance(value, tuple) else (value,):
                bad = fp32_problem(x)
                if bad is not None:
                    raise VerifyError(f"attribute '{name}': {bad[0]}", op=o.name, loc=o.loc,
                                      valid=bad[1])


def check_fp32_attrs(program: Graph | Module) -> None:
    """:func:`check_fp32_op` on every op of a graph or of every graph and kernel of a module."""
    graphs = program.graphs if isinstance(program, Module) else (program,)
    for g in graphs:
        for op in g.body:
            check_fp32_op(op)
