"""C spellings of IR things: dtypes, float literals, identifiers, affine offsets and dims.

Everything the templates print as C++ text comes from here, so generated code is uniform:
``__half`` for f16, ``__nv_bfloat16`` for bf16, exact hexadecimal float literals, ``fc_cluster``
and ``fc_rank`` for the CTA's coordinates, ``dim_B`` for a symbolic dimension ``B``.
"""
from __future__ import annotations

import math
import re

import numpy as np

from fusionc.ir.affine import Affine
from fusionc.ir.types import DType

C_TYPES = {DType.f16: "__half", DType.bf16: "__nv_bfloat16", DType.f32: "float",
           DType.f64: "double", DType.i32: "int", DType.i64: "long long"}

_IDENT = re.compile(r"[^A-Za-z0-9_]")


def ctype(dt: DType) -> str:
    """The C++ element type that stores ``dt``."""
    return C_TYPES[dt]


def f32_literal(x: float) -> str:
    """``x`` rounded to fp32, as an exact C++ literal (hex float; inf and nan spelled out)."""
    v = float(np.float32(x))
    if math.isnan(v):
        return "__int_as_float(0x7fc00000)"
    if math.isinf(v):
        return "(-FC_INF)" if v < 0 else "FC_INF"
    return f"{v.hex()}f" if v != int(v) or abs(v) >= 2 ** 24 else f"{v:.1f}f"


def ident(prefix: str, name: str) -> str:
    """A C identifier for IR name ``name``, one-to-one: letters, digits and ``_`` stay, ``.``
    is ``_Zd`` and any other character ``_Zx<hex>_``; a literal ``_Z`` is ``_ZZ`` (so ``%w.down``
    -> ``v_w_Zddown`` differs from ``%w_down`` -> ``v_w_down``)."""
    return f"{prefix}_{_escape(name)}"


def _escape(name: str) -> str:
    out = name.replace("_Z", "_ZZ")
    if not _IDENT.search(out):
        return out
    return _IDENT.sub(lambda m: "_Zd" if m[0] == "." else f"_Zx{ord(m[0]):x}_", out)


def dim_name(symbol: str) -> str:
    """The kernel argument holding symbolic dim ``symbol`` at run time."""
    return ident("dim", symbol)


def dim(d) -> str:
    """A dimension as C: an int literal or the symbolic dim's argument."""
    return str(d) if isinstance(d, int) else dim_name(d)


def product(dims) -> str:
    """The product of dims as a C int expression (``1`` when empty)."""
    static = 1
    syms = []
    for d in dims:
        if isinstance(d, int):
            static *= d
        else:
            syms.append(dim_name(d))
    parts = ([str(static)] if static != 1 or not syms else []) + syms
    return parts[0] if len(parts) == 1 else "(" + " * ".join(parts) + ")"


def max_product(dims, max_batch: int) -> int:
    """The product of dims with every symbol bound to ``max_batch``."""
    n = 1
    for d in dims:
        n *= d if isinstance(d, int) else max_batch
    return n


def static_part(dims) -> int:
    """The product of the static dims only."""
    n = 1
    for d in dims:
        if isinstance(d, int):
            n *= d
    return n


def affine(a: Affine) -> str:
    """``a*cluster + b*rank + c`` as a C int expression over ``fc_cluster`` and ``fc_rank``."""
    terms = []
    for coef, var in ((a.cluster, "fc_cluster"), (a.rank, "fc_rank")):
        if coef == 1:
            terms.append(var)
        elif coef:
            terms.append(f"{coef} * {var}")
    if a.const or not terms:
        terms.append(str(a.const))
    text = " + ".join(terms).replace("+ -", "- ")
    return text if len(terms) == 1 else f"({text})"


def affine_aligned(a: Affine, elems: int) -> bool:
    """Whether ``a`` is a multiple of ``elems`` for every CTA (all coefficients are)."""
    return a.cluster % elems == 0 and a.rank % elems == 0 and a.const % elems == 0
