"""The op registry: one entry per op holds everything about it.

An :class:`OpDef` keeps together (in the style of JAX primitives) an op's
- signature: operand names (``"bias?"`` optional, ``"xs*"`` variadic) and typed attributes;
- type/shape inference (``infer``), which is also its verification;
- where it may appear (graph IR, tile-IR kernels, host launch sequences);
- the interpreter rule (graph IR, numpy) and simulator rule (tile IR, per CTA);
- its cost (bytes moved, FLOPs) and its CUDA template name.

Attribute kinds and specs live in :mod:`fusionc.ir.attrs` (re-exported here). The text syntax
is the generic form for every op, derived from this entry:
``%r = name(%a, %b) {attr = value, ...} : type``. Adding an op means one module calling
:func:`register`, one template and one test file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from fusionc.errors import VerifyError
from fusionc.ir.nodes import Op
from fusionc.ir.types import DType, TensorType
from fusionc.ir.attrs import (  # noqa: F401  (re-exported: ops import them from here)
    Ident,
    SYMBOL_NAME,
    AttrKind,
    AttrSpec,
    attr,
    enum,
    INT,
    FLOAT,
    BOOL,
    STR,
    INTS,
    DIMS,
    SYMBOL,
    FLOATS,
    POS_INT,
    NONNEG_INT,
    AFFINE,
    AFFINES,
    DTYPE,
    FLOAT_DTYPES_TEXT,
    _REQUIRED,
)


@dataclass(frozen=True, slots=True)
class Cost:
    """Work of one op: bytes read and written in device memory, FLOPs, bytes over DSM."""

    bytes_read: int = 0
    bytes_written: int = 0
    flops: int = 0
    dsm_bytes: int = 0

    def __add__(self, o: "Cost") -> "Cost":
        return Cost(
            self.bytes_read + o.bytes_read,
            self.bytes_written + o.bytes_written,
            self.flops + o.flops,
            self.dsm_bytes + o.dsm_bytes,
        )

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


InferFn = Callable[[Op], tuple[TensorType, ...]]


@dataclass(frozen=True)
class OpDef:
    """Everything about one op. See the module docstring.

    Attributes:
        name: op name in text and in :class:`~fusionc.ir.nodes.Op`.
        doc: what it computes (formula and source).
        operands: operand names; suffix ``?`` marks an optional trailing operand, ``*`` a
            variadic tail.
        attrs: typed attributes, printed in this order.
        infer: result types from the op (operands, attributes); raises VerifyError (use
            :func:`fail`) on ill-typed input. Verification is inference.
        where: function kinds the op may appear in (``"graph"``, ``"kernel"``).
        regions: number of nested regions the op carries.
        interpret: graph-IR interpreter rule, ``(op, args: list[np.ndarray], ctx) -> tuple``.
        simulate: tile-IR simulator rule (per CTA).
        cost: ``(op, env) -> Cost`` with symbolic dims taken from ``env``.
        template: name of the Jinja template that emits it, if it is emitted on its own.
        verify: extra checks that need the graph and module (``(op, graph, module) -> None``).
        collective: executed by all CTAs of a cluster together (barriers, collectives); its
            ``simulate`` rule takes ``(op, ctas)`` and returns each CTA's results.
        traits: facts generic code asks for instead of comparing names (xDSL style):
            ``producer`` (run by a streamed kernel's producer warp), ``stream`` (takes part in
            the shared-memory ring protocol), ``units`` (a work-unit loop), ``accumulates``
            (updates an accumulator operand in place), ``counter`` (a grid-level counter),
            ``elementwise`` (same-shape operands, computed per element: commutes with views),
            ``communication`` (a multi-GPU collective the host runs between kernels).
    """

    name: str
    doc: str
    operands: tuple[str, ...]
    attrs: tuple[AttrSpec, ...]
    infer: InferFn
    where: frozenset[str] = frozenset({"graph"})
    regions: int = 0
    interpret: Callable | None = None
    simulate: Callable | None = None
    cost: Callable | None = None
    template: str | None = None
    verify: Callable | None = None
    collective: bool = False
    traits: frozenset[str] = frozenset()

    def has(self, trait: str) -> bool:
        """Whether the op carries ``trait`` (see ``traits``)."""
        return trait in self.traits

    @property
    def min_operands(self) -> int:
        return sum(1 for o in self.operands if not o.endswith(("?", "*")))

    @property
    def max_operands(self) -> float:
        if any(o.endswith("*") for o in self.operands):
            return math.inf
        return len(self.operands)

    def attr_spec(self, name: str) -> AttrSpec | None:
        for a in self.attrs:
            if a.name == name:
                return a
        return None

    def signature(self) -> str:
        """Human-readable generic syntax, used in error messages."""
        ops = ", ".join("%" + o for o in self.operands)
        ats = ", ".join(
            f"{a.name} = <{a.kind.describe()}>" + ("" if a.required else "?") for a in self.attrs
        )
        return f"{self.name}({ops})" + (f" {{{ats}}}" if ats else "")

    def make_attrs(self, given: dict[str, Any], loc=None) -> tuple[tuple[str, Any], ...]:
        """Check attributes against the schema and return them in canonical order, defaults
        filled. Raises VerifyError naming unknown, missing or ill-typed attributes."""
        names = [a.name for a in self.attrs]
        for k in given:
            if k not in names:
                raise VerifyError(
                    f"unknown attribute '{k}'",
                    op=self.name,
                    loc=loc,
                    valid=", ".join(names) if names else "no attributes",
                )
        out = []
        for a in self.attrs:
            if a.name not in given:
                if a.required:
                    raise VerifyError(
                        f"missing attribute '{a.name}'",
                        op=self.name,
                        loc=loc,
                        valid=self.signature(),
                    )
                out.append((a.name, a.default))
                continue
            if given[a.name] is None and a.default is None:   # an optional attribute unset
                out.append((a.name, None))
                continue
            try:
                out.append((a.name, a.kind.convert(given[a.name])))
            except ValueError as e:
                raise VerifyError(f"attribute '{a.name}': {e}", op=self.name, loc=loc) from None
        return tuple(out)


GRAPH_AND_KERNEL = frozenset({"graph", "kernel"})  # ops also usable on tiles in kernels

_OPS: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Add an op to the registry (ValueError if the name is taken)."""
    if opdef.name in _OPS:
        raise ValueError(f"op '{opdef.name}' registered twice")
    _OPS[opdef.name] = opdef
    return opdef


def lookup(name: str) -> OpDef | None:
    """The registry entry of op ``name``, or None."""
    _load_ops()
    return _OPS.get(name)


def all_ops() -> dict[str, OpDef]:
    """Every registered op by name."""
    _load_ops()
    return dict(_OPS)


def _load_ops() -> None:
    import fusionc.ir.ops  # noqa: F401  (registers the built-in ops on import)


# ----------------------------------------------------------------------------------------------
# function kinds (graph, kernel)


@dataclass(frozen=True)
class FuncKind:
    """A kind of module item (``graph`` or ``kernel``): its attributes and extra checks."""

    name: str
    attrs: tuple[AttrSpec, ...] = ()
    verify: Callable | None = None  # (graph, module) -> None, raises VerifyError

    def make_attrs(self, given: dict[str, Any], loc=None):
        return OpDef(self.name, "", (), self.attrs, lambda op: ()).make_attrs(given, loc)


FUNC_KINDS: dict[str, FuncKind] = {"graph": FuncKind("graph")}


def func_kind(name: str) -> FuncKind | None:
    """The item kind ``name`` (``graph``, ``kernel``), or None."""
    _load_ops()
    return FUNC_KINDS.get(name)


def register_func_kind(kind: FuncKind) -> FuncKind:
    """Add or replace a module item kind (the tile-IR module registers ``kernel``)."""
    FUNC_KINDS[kind.name] = kind
    return kind


# ----------------------------------------------------------------------------------------------
# helpers for infer rules


def fail(op: Op, message: str, valid: str | None = None) -> None:
    """Raise a VerifyError about ``op`` at its location."""
    raise VerifyError(message, op=op.name, loc=op.loc, valid=valid)


def same_dtype(op: Op, *types: TensorType) -> DType:
    """The common dtype of ``types``; a VerifyError if they differ (no implicit casts)."""
    dts = {t.dtype for t in types}
    if len(dts) > 1:
        fail(
            op,
            "operands have mixed dtypes " + ", ".join(str(t) for t in types),
            "operands of one dtype; insert cast(%x) {dtype = ...}",
        )
    return types[0].dtype
