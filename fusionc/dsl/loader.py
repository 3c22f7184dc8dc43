"""Load the module a DSL file describes (``fusionc ir EXAMPLE.py``).

Convention (see ``examples/README.md``): the file defines ``build(**sizes) -> Module`` whose
keyword parameters are the model sizes with defaults; failing that, a module-level ``module``
holding a :class:`fusionc.ir.Module`. The file's folder is put on ``sys.path`` while it loads,
so examples may import each other as a script run with ``python FILE.py`` would.
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import itertools
import sys
from pathlib import Path

from fusionc.errors import DSLError, FusionError, Loc
from fusionc.ir.nodes import Module

_COUNTER = itertools.count()


def load_file(path: str | Path, **sizes) -> Module:
    """The Module built by the DSL file ``path``, calling ``build(**sizes)`` if it has one.

    Raises:
        DSLError: unreadable file, an exception while running it (at the file's line), no
            ``build``/``module``, unknown size names, or ``build`` not returning a Module.
    """
    p = Path(path)
    if not p.is_file():
        raise DSLError(f"cannot read {p}: {'a folder' if p.is_dir() else 'no such file'}",
                       valid="a DSL file (.py) or an IR file (.fir)")
    with _on_path(str(p.parent.resolve())):
        pymod = _exec(p)
        build = getattr(pymod, "build", None)
        if callable(build):
            _check_sizes(build, sizes, p)
            result, what = _call(build, sizes, p), "build()"
        elif sizes:
            raise DSLError(f"{p} has no build() function to pass sizes to",
                           loc=Loc(str(p), 1), valid="def build(**sizes) -> Module")
        else:
            result, what = getattr(pymod, "module", None), "module"
            if result is None and not hasattr(pymod, "module"):
                raise DSLError(f"{p} defines neither build() nor a module-level `module`",
                               loc=Loc(str(p), 1),
                               valid="def build(**sizes) -> Module, or module = fusionc.module("
                                     "...) at the top level")
    if not isinstance(result, Module):
        raise DSLError(f"{what} of {p} is a {type(result).__name__}, not a fusionc.ir.Module",
                       loc=Loc(str(p), 1),
                       valid="def build(**sizes) -> Module, or a module-level `module`")
    return result


def build_parameters(path: str | Path) -> tuple[str, ...]:
    """The parameter names of ``build()`` in DSL file ``path`` (empty without one, and for a
    file that is not ``.py``). Raises DSLError for a missing file or one that fails to run."""
    p = Path(path)
    if not p.is_file():
        raise DSLError(f"cannot read {p}: {'a folder' if p.is_dir() else 'no such file'}")
    if p.suffix != ".py":   # IR text and other files have no build()
        return ()
    with _on_path(str(p.parent.resolve())):
        build = getattr(_exec(p), "build", None)
    return tuple(inspect.signature(build).parameters) if callable(build) else ()


@contextlib.contextmanager
def _on_path(folder: str):
    """``folder`` first on ``sys.path`` for the duration (as for ``python FILE.py``)."""
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


def _exec(p: Path):
    name = f"_fusionc_dsl_file_{p.stem}_{next(_COUNTER)}"
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None:   # not a Python source file name
        raise DSLError(f"cannot load {p} as Python", loc=Loc(str(p), 1),
                       valid="a DSL file named *.py, or IR text named *.fir")
    pymod = importlib.util.module_from_spec(spec)
    sys.modules[name] = pymod
    try:
        spec.loader.exec_module(pymod)
    except FusionError:
        raise
    except SyntaxError as e:
        raise DSLError(f"syntax error: {e.msg}", loc=Loc(str(p), e.lineno or 1)) from None
    except Exception as e:
        raise _wrap(e, p) from None
    return pymod


def _check_sizes(build, sizes: dict, p: Path) -> None:
    params = inspect.signature(build).parameters
    if any(q.kind == q.VAR_KEYWORD for q in params.values()):
        return
    unknown = sorted(set(sizes) - set(params))
    if unknown:
        raise DSLError(f"build() of {p} has no size {', '.join(map(repr, unknown))}",
                       valid=", ".join(params) or "no sizes")
    for name, value in sizes.items():  # -D values arrive as int, float, bool or str
        want, default = params[name].annotation, params[name].default
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if want in (int, "int") and not (number and isinstance(value, int)) or \
                want in (float, "float") and not number:
            kind = want if isinstance(want, str) else want.__name__
            raise DSLError(f"size {name} = {value!r} for build() of {p}",
                           valid=f"{'an integer' if kind == 'int' else 'a number'} "
                                 f"(build() declares {name}: {kind})")
        if want in (int, "int") and _positive(default) and not 1 <= value <= MAX_SIZE:
            raise DSLError(f"size {name} = {value!r} for build() of {p}",
                           valid=f"a positive integer up to {MAX_SIZE} (the kernels index "
                                 f"with 32-bit sizes; the default is {default})")


MAX_SIZE = 2**31 - 1   # sizes reach the kernels as 32-bit ints


def _positive(v) -> bool:
    """Whether ``v`` is a positive int (a default that marks a size, such as heads = 32)."""
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _call(build, sizes: dict, p: Path):
    missing = [n for n, q in inspect.signature(build).parameters.items()
               if q.default is q.empty and q.kind in (q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY)
               and n not in sizes]
    if missing:   # a size without a default: the caller must give it
        raise DSLError(f"build() of {p} needs size{'s' if len(missing) > 1 else ''} "
                       f"{', '.join(missing)}", loc=Loc(str(p), build.__code__.co_firstlineno),
                       valid=" ".join(f"-D {n}=VALUE" for n in missing) + " (in Python: "
                       f"load_file(path, {', '.join(n + '=...' for n in missing)}))")
    try:
        return build(**sizes)
    except FusionError:
        raise
    except Exception as e:
        raise _wrap(e, p) from None


def _wrap(e: Exception, p: Path) -> DSLError:
    """``e`` as a DSLError at the innermost line of ``p`` in its traceback."""
    target, line = str(p.resolve()), None
    tb = e.__traceback__
    while tb is not None:
        if str(Path(tb.tb_frame.f_code.co_filename).resolve()) == target:
            line = tb.tb_lineno
        tb = tb.tb_next
    return DSLError(f"{type(e).__name__}: {e}", loc=Loc(str(p), line) if line else None)
