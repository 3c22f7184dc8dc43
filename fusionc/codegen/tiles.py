"""Index arithmetic for N-d tiles as C statements: flat index -> coordinates -> offsets."""
from __future__ import annotations

from fusionc.codegen import cnames


def unflatten(flat: str, sizes: list[str], prefix: str) -> tuple[list[str], list[str]]:
    """Statements that split ``flat`` (row-major over ``sizes``) into coordinates
    ``prefix0, prefix1, ...``; returns (statements, coordinate names)."""
    names = [f"{prefix}{k}" for k in range(len(sizes))]
    if not sizes:
        return [], []
    if len(sizes) == 1:
        return [f"const int {names[0]} = {flat};"], names
    rest = f"{prefix}r"
    stmts = [f"int {rest} = {flat};"]
    for k in range(len(sizes) - 1, 0, -1):
        stmts.append(f"const int {names[k]} = {rest} % {sizes[k]}; {rest} /= {sizes[k]};")
    stmts.append(f"const int {names[0]} = {rest};")
    return stmts, names


def linear(coords: list[str], shape: list[str]) -> str:
    """Row-major element offset (``long long``) of ``coords`` in a tensor of ``shape``."""
    if not coords:
        return "0"
    expr = f"(long long){coords[0]}"
    for c, n in zip(coords[1:], shape[1:]):
        expr = f"({expr} * {n} + {c})"
    return expr


def shape_c(shape) -> list[str]:
    """Dims as C expressions."""
    return [cnames.dim(d) for d in shape]


def vector_elems(itemsize: int) -> int:
    """Elements in 16 bytes."""
    return 16 // itemsize
