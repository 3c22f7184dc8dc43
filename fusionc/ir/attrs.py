"""Typed op attributes: kinds of attribute values (how to check, normalize and print them),
and attribute specs (name, kind, default) as op registry entries declare them.

Text forms: ints, floats (``1e-05``, ``inf``), ``true``/``false``, quoted strings, bare enum
names (``neox``), lists (``[B, 4096]``), symbol references (``@k0``) and affine index
expressions (``"128*cluster + 32*rank"``, :mod:`fusionc.ir.affine`).
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any

from fusionc.ir.nodes import SymbolRef
from fusionc.ir.types import DType


class Ident(str):
    """A bare identifier as written in IR text (``sum``, ``neox``, ``B``)."""


# A symbol name as the grammar's IDENT terminal spells it (symbolic dims such as ``B``).
SYMBOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")


# ----------------------------------------------------------------------------------------------
# attribute kinds


@dataclass(frozen=True, slots=True)
class AttrKind:
    """A kind of attribute value: how to check/normalize it and how to print it.

    ``name`` is one of int, float, bool, str, enum, ints, dims, symbol, floats.
    """

    name: str
    choices: tuple[str, ...] = ()
    min: float | None = None

    def describe(self) -> str:
        if self.name == "enum":
            return "one of " + ", ".join(self.choices)
        return {
            "int": "an integer",
            "float": "a number",
            "bool": "true or false",
            "str": "a quoted string",
            "ints": "a list of integers [1, 2]",
            "dims": "a list of sizes or symbols [B, 4096]",
            "symbol": "a reference @name",
            "floats": "a list of numbers",
            "affine": 'an index expression such as "128*cluster + 32*rank + 4"',
            "affines": 'a list of index expressions ["cluster", "32*rank"]',
        }[self.name] + (f" >= {self.min:g}" if self.min is not None else "")

    def convert(self, v: Any) -> Any:
        """Normalize ``v`` to this kind or raise ValueError with what is expected."""
        out = self._convert(v)
        if self.min is not None and out < self.min:
            raise ValueError(f"expected {self.describe()}, got {self.format(out)}")
        return out

    def _convert(self, v: Any) -> Any:  # noqa: C901 - a flat dispatch on the kind
        n = self.name
        # numbers.Integral / Real admit numpy scalars; they are stored as plain int / float
        if n == "int" and isinstance(v, numbers.Integral) and not isinstance(v, bool):
            return int(v)
        if n == "float":
            if isinstance(v, numbers.Integral) and not isinstance(v, bool):
                try:
                    v = float(int(v))
                except OverflowError:
                    raise ValueError(
                        f"expected {self.describe()}, got an integer out of the range of a double"
                    ) from None
            elif isinstance(v, numbers.Real) and not isinstance(v, bool):
                v = float(v)
            elif isinstance(v, Ident) and v in ("inf", "-inf"):
                v = float(v)
            if isinstance(v, float) and not math.isnan(v):
                return v
        if n == "bool":
            if isinstance(v, bool):
                return v
            if isinstance(v, Ident) and v in ("true", "false"):
                return v == "true"
        if n == "str" and isinstance(v, str) and not isinstance(v, Ident):
            return str(v)
        if n == "enum" and isinstance(v, (str, DType)) and str(v) in self.choices:
            return str(v)
        if n == "symbol" and isinstance(v, SymbolRef):
            return v
        if n == "affine":
            from fusionc.ir.affine import Affine, parse_affine

            if isinstance(v, Affine):
                return v
            if isinstance(v, int) and not isinstance(v, bool):
                return Affine(const=v)
            if isinstance(v, str) and not isinstance(v, Ident) and len(v) < 200:
                return parse_affine(v)
        if n == "affines" and isinstance(v, (tuple, list)):
            return tuple(AttrKind("affine").convert(x) for x in v)
        if n in ("ints", "dims", "floats") and isinstance(v, (tuple, list)):
            item = {"ints": AttrKind("int"), "floats": AttrKind("float")}.get(n)
            out = []
            for x in v:
                if n == "dims" and isinstance(x, str) and SYMBOL_NAME.match(x):
                    out.append(str(x))
                else:
                    out.append((item or AttrKind("int")).convert(x))
            return tuple(out)
        raise ValueError(f"expected {self.describe()}, got {_show(v)}")

    def format(self, v: Any) -> str:
        """The text form of a (converted) value."""
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            r = repr(v)
            return r if any(c in r for c in ".en") else r + ".0"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, SymbolRef):
            return str(v)
        if self.name == "affine":
            return _quote(str(v))
        if self.name == "affines":
            return "[" + ", ".join(_quote(str(x)) for x in v) + "]"
        if isinstance(v, tuple):
            return "[" + ", ".join(self.format(x) if not isinstance(x, str) else x for x in v) + "]"
        if self.name == "str":
            return _quote(v)
        return str(v)


def _quote(s: str) -> str:
    import json

    return json.dumps(s, ensure_ascii=True)


def _show(v: Any) -> str:
    if isinstance(v, (Ident, SymbolRef, DType)):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return _quote(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return repr(v)


INT, FLOAT, BOOL, STR = AttrKind("int"), AttrKind("float"), AttrKind("bool"), AttrKind("str")
INTS, DIMS, SYMBOL, FLOATS = (
    AttrKind("ints"),
    AttrKind("dims"),
    AttrKind("symbol"),
    AttrKind("floats"),
)
POS_INT = AttrKind("int", min=1)
NONNEG_INT = AttrKind("int", min=0)
AFFINE, AFFINES = AttrKind("affine"), AttrKind("affines")
DTYPE = AttrKind("enum", tuple(d.value for d in DType))
FLOAT_DTYPES_TEXT = "f16, bf16 or f32"


def enum(*choices: str) -> AttrKind:
    """An attribute that takes one of ``choices``, written bare (``style = neox``)."""
    return AttrKind("enum", tuple(choices))


_REQUIRED = object()


@dataclass(frozen=True, slots=True)
class AttrSpec:
    """One attribute of an op: name, kind, default (omitted = required), documentation."""

    name: str
    kind: AttrKind
    default: Any = _REQUIRED
    doc: str = ""
    omit: bool = False   # printed only when it differs from the default

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def attr(name: str, kind: AttrKind, default: Any = _REQUIRED, doc: str = "",
         omit: bool = False) -> AttrSpec:
    """Declare an attribute (see :class:`AttrSpec`); ``omit``: leave it out of the printed
    text at its default (it parses back to the default)."""
    return AttrSpec(name, kind, default, doc, omit)


# ----------------------------------------------------------------------------------------------
# ops
