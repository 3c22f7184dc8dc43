"""Pipeline strings and the pass manager.

A pipeline is written ``"fold-views,partition-units{max_batch=4}"``: pass names with optional
``{option=value,...}``. :func:`run_pipeline` verifies the IR after every pass and can dump the
IR after any pass (``dump=`` argument or ``FUSIONC_DUMP=after:NAME`` / ``after:all``).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Callable

import lark

from fusionc.errors import Loc, PassError
from fusionc.ir.nodes import Module
from fusionc.ir.printer import print_module
from fusionc.ir.verifier import verify_module
from fusionc.passes.base import PASSES, Pass

# lowering v2's fused kernels at a batch bucket of 8, linears chained (partition-units'
# defaults): run_pipeline's default
DEFAULT_PIPELINE = ("fold-views,fuse-allreduce-norm,partition-units{max_batch=8},stream-plan,"
                    "insert-barriers,smem-plan")

_GRAMMAR = r"""
start: step ("," step)*
step: NAME ("{" [opt ("," opt)*] "}")?
opt: NAME "=" VAL
NAME: /[A-Za-z_][A-Za-z0-9_-]*/
VAL: /[^,{}=\s]+/
%ignore /\s+/
"""


@functools.cache
def _parser() -> lark.Lark:
    return lark.Lark(_GRAMMAR, parser="lalr")


def parse_pipeline(text: str) -> list[Pass]:
    """Pass instances from a pipeline string. Raises PassError (with the column) on unknown
    passes or options, or malformed text."""
    _load_passes()
    try:
        tree = _parser().parse(text)
    except lark.exceptions.UnexpectedInput as e:
        raise PassError(f"bad pipeline {text!r}", loc=Loc("pipeline", 1, e.column),
                        valid='"pass-a{opt=1},pass-b"') from None
    return [_make(step, text) for step in tree.children]


def _make(step, text: str) -> Pass:
    name = str(step.children[0])
    cls = PASSES.get(name)
    if cls is None:
        raise PassError(f"unknown pass '{name}'", loc=Loc("pipeline", 1, step.children[0].column),
                        valid=", ".join(sorted(PASSES)))
    fields = {f.name: f for f in dataclasses.fields(cls)}
    opts = {}
    for opt in (o for o in step.children[1:] if o is not None):   # "fold-views{}": no options
        key, raw = str(opt.children[0]), str(opt.children[1])
        if key not in fields:
            raise PassError(f"pass '{name}' has no option '{key}'", op=name,
                            valid=", ".join(fields) or "no options")
        if key in opts:
            raise PassError(f"option '{key}' of pass '{name}' given twice", op=name,
                            loc=Loc("pipeline", 1, opt.children[0].column),
                            valid="each option once")
        opts[key] = _convert(name, key, raw, fields[key].type)
    made = cls(**opts)
    check = getattr(made, "check_options", None)
    if check is not None:
        check()
    return made


def _convert(name: str, key: str, raw: str, typ) -> object:
    typ = typ if isinstance(typ, str) else typ.__name__
    try:
        if "bool" in typ:
            if raw not in ("true", "false", "1", "0"):
                raise ValueError
            return raw in ("true", "1")
        if "int" in typ:
            return int(raw)
        if "float" in typ:
            return float(raw)
        return raw
    except ValueError:
        raise PassError(f"option {key}={raw} of pass '{name}'", op=name,
                        valid="true, false, 1 or 0" if "bool" in typ else
                        f"a value of type {typ}") from None


def run_pipeline(module: Module, pipeline: str | list[Pass] = DEFAULT_PIPELINE,
                 dump: str | None = None,
                 on_stage: Callable[[str, Module], None] | None = None) -> Module:
    """Run passes in order, verifying after each.

    Args:
        module: valid input IR.
        pipeline: a pipeline string or pass list.
        dump: ``after:NAME`` or ``after:all`` prints the IR after that pass to stderr
            (default from ``FUSIONC_DUMP``).
        on_stage: called with (pass spec, module) after every pass (used by ``fusionc compile``
            to write each stage to disk).
    """
    passes = parse_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
    dump = dump if dump is not None else os.environ.get("FUSIONC_DUMP", "")
    names = [p.name for p in passes]
    if dump and (not dump.startswith("after:") or
                 dump != "after:all" and dump.removeprefix("after:") not in names):
        what = "names no pass of this pipeline" if dump.startswith("after:") else \
            "lacks 'after:'"
        raise PassError(f"dump request {dump!r} {what}",
                        valid="after:all or after:NAME with NAME one of " + ", ".join(names))
    verify_module(module)
    _check_order(module, passes)
    for p in passes:
        module = p.run(module)
        verify_module(module)
        if dump in (f"after:{p.name}", "after:all"):
            print(f"// ----- IR after {p.spec()}\n{print_module(module)}", file=sys.stderr)
        if on_stage:
            on_stage(p.spec(), module)
    return module


def _load_passes() -> None:
    import fusionc.passes  # noqa: F401  (registers every pass)


def _check_order(module: Module, passes: list) -> None:
    """PassError for a pass before every pass it requires (``Pass.requires``), on graph IR:
    run there it would do nothing, or fail on what no earlier pass made."""
    if any(g.kind == "kernel" for g in module.graphs):   # lowered input: trusted
        return
    seen: set[str] = set()
    for p in passes:
        if p.requires and not seen & set(p.requires):
            from fusionc.passes.stream import v2_pipeline
            raise PassError(f"{p.name} with no {' or '.join(p.requires)} before it",
                            op=p.name, valid=f"{' or '.join(p.requires)} earlier in the "
                            f"pipeline, e.g. {v2_pipeline(8)}")
        seen.add(p.name)
