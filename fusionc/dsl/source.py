"""Source locations of DSL code: the user's ``file:line`` behind every traced op.

The DSL records, for each op, the innermost stack frame outside the ``fusionc.dsl`` package —
the line of user code that called ``fusionc.linear(...)`` or wrote ``a + b``. Errors found while
tracing (by the op's type inference, say) are re-raised as :class:`fusionc.errors.DSLError` at
that line.
"""
from __future__ import annotations

import os
import sys

from fusionc.errors import DSLError, FusionError, Loc

_DSL_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_loc() -> Loc | None:
    """``Loc(file, line)`` of the innermost caller outside ``fusionc/dsl`` (None if none)."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_DSL_DIR):
        f = f.f_back
    return Loc(f.f_code.co_filename, f.f_lineno) if f is not None else None


def code_loc(fn) -> Loc | None:
    """Where the Python function ``fn`` is defined (its first line)."""
    code = getattr(fn, "__code__", None)
    return Loc(code.co_filename, code.co_firstlineno) if code is not None else None


def as_dsl_error(e: FusionError, loc: Loc | None) -> DSLError:
    """``e`` (a VerifyError from inference, say) as a DSLError at the user's ``loc``."""
    return DSLError(e.message, op=e.op, loc=loc or e.loc, valid=e.valid)
