"""Input type specs of the DSL: ``f16["B", 4096]`` and ``Tensor("f16", "B", 4096)``.

A dimension is a positive ``int`` (fixed at compile time: model sizes) or a ``str`` naming a
symbolic size bound at run time (by convention ``"B"``, the number of decode tokens). Both forms
produce a :class:`fusionc.ir.TensorType`; use them as parameter annotations of a
``@fusionc.graph`` function or as keyword arguments of the decorator.
"""
from __future__ import annotations

from fusionc.dsl.source import user_loc
from fusionc.errors import DSLError
from fusionc.ir.types import DType, TensorType

_DTYPES = ", ".join(d.value for d in DType)


class ElemType:
    """An element type usable in annotations: ``f16["B", 4096]`` is ``f16[B, 4096]``.

    ``f32[()]`` is a scalar (rank 0). Instances: ``fusionc.f16, bf16, f32, f64, i32, i64``;
    ``fusionc.dtype("bf16")`` picks one by name (handy when the dtype is a parameter).
    """

    __slots__ = ("dtype",)

    def __init__(self, dtype: DType | str):
        self.dtype = to_dtype(dtype)

    def __getitem__(self, dims) -> TensorType:
        if not isinstance(dims, tuple):
            dims = (dims,)
        return make_type(self.dtype, dims)

    def __repr__(self) -> str:
        return f"fusionc.{self.dtype.value}"


def to_dtype(d) -> DType:
    """A DType from ``"f16"``, a DType or an ElemType; DSLError otherwise."""
    if isinstance(d, ElemType):
        return d.dtype
    if isinstance(d, DType):
        return d
    try:
        return DType(d)
    except (ValueError, TypeError):
        raise DSLError(f"unknown dtype {d!r}", loc=user_loc(), valid=_DTYPES) from None


def make_type(dtype, dims) -> TensorType:
    """Check ``dims`` (positive ints or identifiers) and build the TensorType."""
    out = []
    for d in dims:
        if hasattr(d, "__index__") and not isinstance(d, (bool, int)):
            d = d.__index__()  # numpy integers
        if isinstance(d, bool) or not (
                (isinstance(d, int) and d >= 1) or (isinstance(d, str) and d.isidentifier()
                                                    and d.isascii())):
            raise DSLError(f"bad dimension {d!r} in a {to_dtype(dtype)} tensor type",
                           loc=user_loc(), valid="positive integers or symbol names such as 'B'")
        out.append(d)
    return TensorType(to_dtype(dtype), tuple(out))


def Tensor(dtype, *shape) -> TensorType:  # noqa: N802 - reads like a type constructor
    """The type of a graph input: ``Tensor("f16", "B", 4096)`` equals ``f16["B", 4096]``."""
    return make_type(dtype, shape)


def dtype(name: str) -> ElemType:
    """The element type called ``name`` (``"f16"``, ``"bf16"``, ``"f32"``, ``"i32"``, ...)."""
    return ElemType(name)


f16, bf16, f32, f64 = ElemType("f16"), ElemType("bf16"), ElemType("f32"), ElemType("f64")
i32, i64 = ElemType("i32"), ElemType("i64")
