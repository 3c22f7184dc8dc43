"""The table of op emitters: how each tile-IR op (and each graph op allowed in kernels) becomes
CUDA. One entry per op; the op modules ``ops_*.py`` fill it when imported.

An emitter renders the op's template (``templates/ops/<name>.cu.j2``) with the operands'
:class:`~fusionc.codegen.refs.Ref` and its attributes turned into C expressions. It also says
what the op needs around it: shared-memory scratch while it runs, whether its result is a view
of its operand (no code), which operands it writes (stores), and checks that reject
configurations the generated code cannot run, before any NVRTC call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fusionc.errors import CompileError
from fusionc.ir.nodes import Graph, Op


@dataclass(frozen=True)
class Emitter:
    """How one op is emitted. See the module docstring."""

    emit: Callable  # (op, ctx: EmitCtx) -> str
    scratch: Callable | None = None  # (op, kernel) -> bytes of shared-memory scratch
    view: bool = False  # the result aliases operand 0 (reshape): no code, no copy
    writes_operands: tuple[int, ...] = ()  # operands the op writes (and does not read)
    check: Callable | None = None  # (op, kernel) -> None, raises CompileError
    collective: bool = False  # reads peers' shared memory (debug delay goes before it)


EMITTERS: dict[str, Emitter] = {}


def emitter(name: str, **kw):
    """Decorator: register the decorated ``(op, ctx) -> str`` as the emitter of op ``name``."""
    def wrap(fn):
        EMITTERS[name] = Emitter(fn, **kw)
        return fn
    return wrap


def get(op: Op) -> Emitter:
    """The emitter of ``op``; a CompileError naming the op and its line if there is none."""
    _load()
    em = EMITTERS.get(op.name)
    if em is None:
        raise CompileError("no CUDA code generation for this op inside a kernel", op=op.name,
                           loc=op.loc, valid=", ".join(sorted(set(EMITTERS) | CONTROL)))
    return em


def scratch_bytes(op: Op, kernel: Graph) -> int:
    """Shared-memory scratch of ``op`` (0 for control ops and ops without an emitter)."""
    _load()
    em = EMITTERS.get(op.name)
    return em.scratch(op, kernel) if em is not None and em.scratch else 0


def is_view(op: Op) -> bool:
    """Whether ``op``'s result is a view of its first operand (no code, shared storage)."""
    _load()
    em = EMITTERS.get(op.name)
    return bool(em and em.view)


# Ops that the body walker emits itself (control flow and barriers).
CONTROL = frozenset({"when", "exit", "barrier", "cluster_barrier"})


def _load() -> None:
    from fusionc.codegen import (ops_attention, ops_collective, ops_compute,  # noqa: F401
                                 ops_graph, ops_grid, ops_memory)
