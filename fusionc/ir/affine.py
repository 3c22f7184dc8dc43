"""Affine index expressions over the CTA's coordinates, used by tile-IR attributes.

A tile op says which part of a tensor a CTA touches with offsets such as
``"128*cluster + 32*rank + 4"``: an integer combination of ``cluster`` (the cluster's index in
the grid), ``rank`` (the CTA's rank in its cluster) and a constant. Text form is that string,
printed canonically, so it round-trips exactly.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_TERM = re.compile(r"\s*([+-])?\s*(?:(\d+)\s*\*\s*)?(cluster|rank|\d+)\s*")


@dataclass(frozen=True, slots=True)
class Affine:
    """``a*cluster + b*rank + c``."""

    cluster: int = 0
    rank: int = 0
    const: int = 0

    def __call__(self, cluster: int, rank: int) -> int:
        """The value for one CTA."""
        return self.cluster * cluster + self.rank * rank + self.const

    @property
    def uses_rank(self) -> bool:
        return self.rank != 0

    def __str__(self) -> str:
        parts = []
        for coef, name in ((self.cluster, "cluster"), (self.rank, "rank")):
            if coef:
                parts.append((coef, name if coef in (1, -1) else f"{abs(coef)}*{name}"))
        if self.const or not parts:
            parts.append((self.const, str(abs(self.const))))
        text = ""
        for i, (coef, body) in enumerate(parts):
            sign = "-" if coef < 0 else "+"
            text += (("-" if sign == "-" else "") if i == 0 else f" {sign} ") + body
        return text


def parse_affine(text: str) -> Affine:
    """Parse ``"a*cluster + b*rank + c"`` (terms in any order). ValueError if malformed."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("expected an index expression such as \"128*cluster + 32*rank\"")
    coefs = {"cluster": 0, "rank": 0, "const": 0}
    pos = 0
    while pos < len(text):
        m = _TERM.match(text, pos)
        if not m or m.end() == pos or (pos and not m.group(1)):
            raise ValueError(f"bad index expression {text!r}: expected terms like "
                             "128*cluster, 32*rank or 4 joined by + or -")
        sign = -1 if m.group(1) == "-" else 1
        mult = int(m.group(2)) if m.group(2) else 1
        var = m.group(3)
        if var.isdigit():
            if m.group(2):
                raise ValueError(f"bad index expression {text!r}: constant times constant")
            coefs["const"] += sign * int(var)
        else:
            coefs[var] += sign * mult
        pos = m.end()
    return Affine(coefs["cluster"], coefs["rank"], coefs["const"])
