"""How generated code names a tile value: a typed pointer into shared or global memory."""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.codegen import cnames
from fusionc.ir.types import DType


@dataclass(frozen=True)
class Ref:
    """A value as the generated code sees it.

    ``ptr`` is a C identifier (a ``T*`` into dynamic shared memory, or a kernel parameter),
    ``region`` what the hazard tracker compares: ``("smem", lo, hi)`` or ``("global", name)``.
    """

    name: str
    ptr: str
    dtype: DType
    shape: tuple
    space: str
    region: tuple
    readonly: bool = False

    @property
    def ctype(self) -> str:
        return cnames.ctype(self.dtype)

    @property
    def numel(self) -> str:
        """Element count as a C expression (symbolic dims read at run time)."""
        return cnames.product(self.shape)

    def max_numel(self, max_batch: int) -> int:
        return cnames.max_product(self.shape, max_batch)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize
