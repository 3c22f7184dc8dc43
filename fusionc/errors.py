"""Errors raised by fusionc for user mistakes.

Every error a user can provoke (bad DSL code, bad IR text, an unsupported configuration) is a
subclass of :class:`FusionError`. The message names the op, the location (DSL ``file:line`` or IR
``line:column``) and what would be valid, so that the command-line tools can print it without a
Python traceback.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Loc:
    """A source location: a DSL file and line, or a line and column of IR text.

    ``file`` is None for IR text given as a string; ``col`` is None for DSL locations.
    Lines and columns are 1-based.
    """

    file: str | None
    line: int
    col: int | None = None

    def __str__(self) -> str:
        head = f"{self.file}:" if self.file else ""
        return f"{head}{self.line}" + (f":{self.col}" if self.col is not None else "")


class FusionError(Exception):
    """Base class of every fusionc error meant for a user.

    Args:
        message: what is wrong.
        op: the name of the op (or DSL function) concerned, if any.
        loc: where, if known.
        valid: what would be valid instead, if that can be said.
    """

    kind = "error"

    def __init__(self, message: str, *, op: str | None = None, loc: Loc | None = None,
                 valid: str | None = None):
        self.message, self.op, self.loc, self.valid = message, op, loc, valid
        super().__init__(self.render())

    def render(self) -> str:
        """The one-line (or few-line) text shown to the user."""
        where = f"{self.loc}: " if self.loc else ""
        what = f"'{self.op}': " if self.op else ""
        text = f"{where}{self.kind}: {what}{self.message}"
        if self.valid:
            text += f" (valid: {self.valid})"
        return text

    def with_loc(self, loc: Loc | None) -> "FusionError":
        """A copy of this error at ``loc`` when it has no location yet."""
        if self.loc is not None or loc is None:
            return self
        return type(self)(self.message, op=self.op, loc=loc, valid=self.valid)


class ParseError(FusionError):
    """IR text that does not follow the grammar, or names an unknown op or attribute."""

    kind = "parse error"


class VerifyError(FusionError):
    """IR that parses but breaks a rule: types, shapes, SSA, attributes, resource limits."""

    kind = "verify error"


class DSLError(FusionError):
    """A mistake in a DSL function, reported at the user's line."""

    kind = "DSL error"


class PassError(FusionError):
    """A pass (or pipeline string) that cannot be applied as asked."""

    kind = "pass error"


class LoweringError(FusionError):
    """A graph that cannot be lowered to tile IR or CUDA with the given options."""

    kind = "lowering error"


class SimulationError(FusionError):
    """A tile program that breaks the execution model: an unsynchronized read, a collective
    not reached by every CTA, a CTA leaving while a peer may still read its shared memory."""

    kind = "simulation error"


class CompileError(FusionError):
    """NVRTC rejected generated CUDA, or a kernel exceeds a device limit."""

    kind = "compile error"


class DeviceError(FusionError):
    """No suitable GPU or driver, or a launch failed."""

    kind = "device error"


class InputError(FusionError):
    """A run-time argument of the wrong shape, dtype, device, layout or alignment."""

    kind = "input error"


class NumericsError(FusionError):
    """A computed result is not finite where it must be (e.g. NaN logits while decoding)."""

    kind = "numerics error"
