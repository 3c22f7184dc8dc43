"""Symbolic tensors: the values a ``@fusionc.graph`` function computes with while it is traced.

A :class:`Tracer` stands for one SSA value of the graph being built. It knows its name, dtype and
shape (ints and symbols such as ``B``) but holds no data. ``a + b`` and ``a * b`` record
``add`` / ``mul`` ops; everything else is a ``fusionc.*`` op function.
"""
from __future__ import annotations

from fusionc.dsl.source import user_loc
from fusionc.errors import DSLError
from fusionc.ir.nodes import Value
from fusionc.ir.types import DType, TensorType


class Tracer:
    """A traced tensor: one value of the graph under construction (no data)."""

    __slots__ = ("value", "builder")

    def __init__(self, value: Value, builder):
        self.value, self.builder = value, builder

    @property
    def name(self) -> str:
        """The IR name (printed ``%name``)."""
        return self.value.name

    @property
    def type(self) -> TensorType:
        return self.value.type

    @property
    def dtype(self) -> DType:
        return self.value.type.dtype

    @property
    def shape(self) -> tuple:
        """Dims: ints, and strings for symbolic sizes (``("B", 4096)``)."""
        return self.value.type.shape

    @property
    def ndim(self) -> int:
        return self.value.type.rank

    def __repr__(self) -> str:
        return f"Tracer(%{self.name}: {self.type})"

    # ------------------------------------------------------------------ operators and methods
    def __add__(self, other):
        from fusionc.dsl.ops_basic import add
        return add(self, other)

    def __radd__(self, other):
        from fusionc.dsl.ops_basic import add
        return add(other, self)

    def __mul__(self, other):
        from fusionc.dsl.ops_basic import mul
        return mul(self, other)

    def __rmul__(self, other):
        from fusionc.dsl.ops_basic import mul
        return mul(other, self)

    def reshape(self, *shape, name: str | None = None) -> "Tracer":
        """``fusionc.reshape(self, shape)``."""
        from fusionc.dsl.ops_basic import reshape
        return reshape(self, *shape, name=name)

    def cast(self, dtype, name: str | None = None) -> "Tracer":
        """``fusionc.cast(self, dtype)``."""
        from fusionc.dsl.ops_basic import cast
        return cast(self, dtype, name=name)

    # ------------------------------------------------------------------ things a trace cannot do
    def __bool__(self):
        raise DSLError(f"%{self.name} has no truth value while tracing", loc=user_loc(),
                       valid="Python control flow on sizes and dtypes (x.shape, x.dtype), "
                             "not on tensor data")

    def __iter__(self):
        raise DSLError(f"cannot iterate over %{self.name}", loc=user_loc(),
                       valid="fusionc.split(x, sizes) to cut a tensor into parts")

    def __len__(self):
        raise DSLError(f"len() of %{self.name}", loc=user_loc(), valid="x.shape[0]")
