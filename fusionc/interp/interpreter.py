"""numpy interpreter of graph IR: the reference semantics of every graph op.

Each op's rule lives in its registry entry (``OpDef.interpret``, in ``fusionc/ir/ops``) with the
signature ``rule(op, args, ctx) -> tuple[np.ndarray, ...]``: ``args`` are the operand arrays as
stored, ``ctx`` a :class:`Context`. This module binds inputs, runs the rules in program order and
rounds every result to its IR dtype.

Numerics: arithmetic in float32 (``ctx.acc``), like fp32 accumulation on the GPU; each result is
rounded to its dtype with :func:`fusionc.interp.numerics.round_to` (f16 in float16, bf16 in
float32 with the low 16 bits zero). ``precise=True`` gives the float64 reference: arithmetic in
float64 and results kept in float64 without rounding (inputs are still rounded to their dtype —
they are the data).

Several ranks (tensor parallelism): pass one input dict per rank. The graph runs on all ranks in
lockstep, one op at a time, each rank on its own values; ``all_reduce`` sums over the ranks of
its group (consecutive ranks ``[g·k, g·k + g)``) in rank order.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from fusionc.errors import FusionError, InputError
from fusionc.interp.numerics import accumulate_dtype, round_to
from fusionc.ir.nodes import Graph, Module, Value
from fusionc.ir.registry import lookup
from fusionc.ir.types import TensorType

Outputs = tuple[np.ndarray, ...]


class Context:
    """What a rule may ask about the run: precision, concrete shapes, peers' values."""

    def __init__(self, rank: int, values: list[dict[str, np.ndarray]], env: dict[str, int],
                 precise: bool):
        self.rank, self._values, self.env, self.precise = rank, values, env, precise
        self.acc = accumulate_dtype(None, precise)

    @property
    def num_ranks(self) -> int:
        return len(self._values)

    def shape(self, v: Value) -> tuple[int, ...]:
        """The concrete shape of ``v`` (symbolic dims from the bound inputs)."""
        return v.type.concrete(self.env)

    def group_values(self, v: Value, group: int, op=None) -> list[np.ndarray]:
        """``v`` on every rank of this rank's group of ``group`` ranks, in rank order."""
        if group < 1 or self.num_ranks % group:
            raise InputError(f"a group of {group} ranks over {self.num_ranks} simulated ranks",
                             op=op.name if op else None, loc=op.loc if op else None,
                             valid=f"pass a list of {group} (or a multiple of {group}) input "
                                   "dicts, one per rank")
        first = self.rank // group * group
        return [self._values[r][v.name] for r in range(first, first + group)]


def interpret(program: Module | Graph, inputs: Mapping | Sequence[Mapping], *,
              graph: str | None = None, precise: bool = False, ranks: int | None = None):
    """Run a graph-IR graph on numpy inputs.

    Args:
        program: a Module (with one graph, or pick one with ``graph=``) or a Graph.
        inputs: ``{param name: array}``; or a list of such dicts, one per simulated rank.
        graph: the graph to run when the module has several.
        precise: float64 arithmetic without rounding (the reference), else float32 with every
            result rounded to its dtype.
        ranks: run this many ranks with the same ``inputs`` dict (default 1).
    Returns:
        For one rank (a dict and ``ranks`` None or 1): a tuple with one array per graph output,
        in the output dtype (``DType.numpy``; float64 when ``precise``). For several ranks: a
        list of such tuples, one per rank.
    Raises:
        InputError: missing, unknown or ill-shaped inputs, inconsistent symbolic sizes,
            out-of-range positions or lengths.
    """
    g = _select(program, graph)
    values, env, many = bind_ranks(g, inputs, ranks, precise)
    ctxs = [Context(r, values, env, precise) for r in range(len(values))]
    for op in g.body:
        d = lookup(op.name)
        if d is None or d.interpret is None or op.regions:
            raise FusionError("op has no interpreter rule", op=op.name, loc=op.loc,
                              valid="graph-IR ops; simulate tile IR with fusionc.sim")
        for ctx, vals in zip(ctxs, values):
            outs = d.interpret(op, [vals[v.name] for v in op.operands], ctx)
            for res, arr in zip(op.results, outs, strict=True):
                vals[res.name] = _store(arr, res, ctx, op)
    outs = [tuple(vals[v.name] for v in g.outputs) for vals in values]
    return outs if many else outs[0]


def bind_ranks(g: Graph, inputs, ranks: int | None = None, precise: bool = False):
    """``(values, env, many)``: the bound inputs of every simulated rank (see
    :func:`bind_inputs`), the symbolic sizes (equal on every rank), and whether the caller gave
    several ranks (a list of dicts, or ``ranks`` > 1).

    Raises:
        InputError: not a dict or a non-empty list of dicts, a bad ``ranks``, or sizes that
            differ between ranks.
    """
    many = not isinstance(inputs, Mapping) or (ranks or 1) > 1
    values, env = [], None
    for r, inp in enumerate(_per_rank(inputs, ranks)):
        vals, env_r = bind_inputs(g, inp, precise)
        if env is not None and env_r != env:
            raise InputError(f"rank {r} has sizes {env_r} but rank 0 has {env}",
                             valid="the same symbolic sizes on every rank")
        values.append(vals)
        env = env_r
    return values, env, many


def _select(program, name: str | None) -> Graph:
    if isinstance(program, Graph):
        return program
    if not isinstance(program, Module):
        raise InputError(f"cannot interpret a {type(program).__name__}",
                         valid="a fusionc.ir.Module or Graph")
    if name is None and len(program.graphs) == 1:
        return program.graphs[0]
    if name in program.names:
        return program[name]
    raise InputError(f"which graph? {'no graph named ' + repr(name) if name else 'several'}",
                     valid="graph= one of " + ", ".join(program.names))


def _per_rank(inputs, ranks: int | None) -> list[Mapping]:
    if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int)
                              or ranks < 1):
        raise InputError(f"ranks = {ranks!r}", valid="None or a positive number of ranks")
    if isinstance(inputs, Mapping):
        return [inputs] * (ranks or 1)
    try:
        per_rank = list(inputs)
    except TypeError:
        per_rank = []
    if not per_rank or not all(isinstance(i, Mapping) for i in per_rank):
        raise InputError("inputs must be a dict or a non-empty list of dicts (one per rank)")
    if ranks is not None and ranks != len(per_rank):
        raise InputError(f"ranks={ranks} but {len(per_rank)} input dicts given",
                         valid="one input dict per rank")
    return per_rank


def bind_inputs(g: Graph, inputs: Mapping, precise: bool = False):
    """Check ``inputs`` against the parameters of ``g``; bind symbolic dims.

    Returns ``(values, env)``: arrays rounded to their parameter dtypes (float64 when
    ``precise``) by name, and ``{symbol: size}``.
    """
    names = [p.name for p in g.params]
    missing = [n for n in names if n not in inputs]
    unknown = sorted(set(inputs) - set(names))
    if missing or unknown:
        what = (f"missing inputs {missing}" if missing else "") + \
               ("; " if missing and unknown else "") + \
               (f"unknown inputs {unknown}" if unknown else "")
        raise InputError(f"graph @{g.name}: {what}", loc=g.loc,
                         valid=", ".join(f"{p.name}: {p.type}" for p in g.params))
    env: dict[str, int] = {}
    values = {}
    for p in g.params:
        arr = np.asarray(inputs[p.name])
        _bind(p, arr, env, g)
        values[p.name] = _convert(arr, p.type, precise)
    return values, env


def _bind(p: Value, arr: np.ndarray, env: dict[str, int], g: Graph) -> None:
    t = p.type
    kind_ok = arr.dtype.kind in ("f" if t.dtype.is_float else "iu")
    if not kind_ok:
        raise InputError(f"graph @{g.name}: input '{p.name}' has dtype {arr.dtype}", loc=g.loc,
                         valid=f"{'a float' if t.dtype.is_float else 'an integer'} array "
                               f"for {t}")
    bad = arr.ndim != t.rank
    for d, n in zip(t.shape, arr.shape):
        if isinstance(d, int):
            bad = bad or d != n
        elif env.setdefault(d, n) != n:
            raise InputError(f"graph @{g.name}: input '{p.name}' of shape {arr.shape} gives "
                             f"{d} = {n}, but an earlier input gives {d} = {env[d]}",
                             loc=g.loc, valid=f"one size per symbol; {p.name}: {t}")
    if bad:
        raise InputError(f"graph @{g.name}: input '{p.name}' has shape {arr.shape}",
                         loc=g.loc, valid=f"{p.name}: {t}")


def _convert(arr: np.ndarray, t: TensorType, precise: bool) -> np.ndarray:
    if not t.dtype.is_float:
        info = np.iinfo(t.dtype.numpy)
        if arr.size and arr.dtype.kind in "iu" and (arr.min() < info.min or arr.max() > info.max):
            raise InputError(f"integers from {arr.min()} to {arr.max()} for {t}",
                             valid=f"{t.dtype.value} values, {info.min} to {info.max}")
        return arr.astype(t.dtype.numpy)
    stored = round_to(arr, t.dtype)
    return stored.astype(np.float64) if precise else stored


def _store(arr, res: Value, ctx: Context, op) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.shape != ctx.shape(res):
        raise FusionError(f"interpreter rule gave shape {arr.shape} for %{res.name}: "
                          f"{res.type} (internal error)", op=op.name, loc=op.loc)
    if not res.type.dtype.is_float:
        return arr.astype(res.type.dtype.numpy)
    if ctx.precise:
        return arr.astype(np.float64)
    return round_to(arr, res.type.dtype)
