"""IR types: element dtypes and tensor types with static or symbolic dimensions.

A dimension is an ``int`` (static) or a ``str`` naming a symbolic size that is known only at run
time — by convention ``B`` for the batch (decode tokens) dimension. Text form: ``f16[B, 4096]``,
``f32[]`` for a scalar.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

Dim = int | str


class DType(enum.Enum):
    """Element types. Storage dtypes are f16, bf16, f32; i32/i64 carry positions and lengths."""

    f16 = "f16"
    bf16 = "bf16"
    f32 = "f32"
    f64 = "f64"
    i32 = "i32"
    i64 = "i64"

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i32": 4, "i64": 8}[self.value]

    @property
    def is_float(self) -> bool:
        return self.value[0] in "fb"

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype used to hold values of this type. bf16 has no numpy dtype: it is held
        in float32 after rounding (see ``fusionc.interp.numerics``)."""
        return np.dtype({"f16": np.float16, "bf16": np.float32, "f32": np.float32,
                         "f64": np.float64, "i32": np.int32, "i64": np.int64}[self.value])

    def __str__(self) -> str:
        return self.value


FLOAT_DTYPES = (DType.f16, DType.bf16, DType.f32)


@dataclass(frozen=True, slots=True)
class TensorType:
    """A tensor of ``dtype`` with ``shape`` (a tuple of ints and symbol names), row-major."""

    dtype: DType
    shape: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def numel(self, env: dict[str, int] | None = None) -> int:
        """Number of elements, with symbolic dims taken from ``env`` (KeyError if missing)."""
        n = 1
        for d in self.shape:
            n *= d if isinstance(d, int) else (env or {})[d]
        return n

    def nbytes(self, env: dict[str, int] | None = None) -> int:
        """Size in bytes, with symbolic dims from ``env``."""
        return self.numel(env) * self.dtype.itemsize

    def with_shape(self, shape) -> "TensorType":
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> "TensorType":
        return TensorType(dtype, self.shape)

    def concrete(self, env: dict[str, int]) -> tuple[int, ...]:
        """The shape with symbolic dims replaced from ``env``."""
        return tuple(d if isinstance(d, int) else env[d] for d in self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


def tensor(dtype: DType | str, *shape: Dim) -> TensorType:
    """Shorthand: ``tensor("f16", "B", 4096)``."""
    return TensorType(DType(dtype) if isinstance(dtype, str) else dtype, tuple(shape))


def bind_shapes(params, shapes: dict, where: str | None = None,
                env: dict[str, int] | None = None) -> dict[str, int]:
    """Bind symbolic dims from concrete shapes: ``{symbol: size}``.

    Args:
        params: the Values (name and TensorType) to bind.
        shapes: parameter name -> concrete shape (any sequence of ints).
        where: the graph or kernel named in errors.
        env: sizes already bound (kept, and checked against).
    Raises:
        InputError: a missing parameter, a rank or a static size that differs, or one symbol
            bound to two sizes.
    """
    from fusionc.errors import InputError
    env = dict(env or {})
    for p in params:
        if p.name not in shapes:
            raise InputError(f"missing argument %{p.name}", op=where,
                             valid="every parameter: " + ", ".join(q.name for q in params))
        shape = tuple(int(n) for n in shapes[p.name])
        ok = len(shape) == p.type.rank
        for d, n in zip(p.type.shape, shape):
            ok = ok and (env.setdefault(d, n) == n if isinstance(d, str) else d == n)
        if not ok:
            raise InputError(f"argument %{p.name} has shape {list(shape)}", op=where,
                             valid=f"{p.type}" + (f" with {env}" if env else ""))
    return env
