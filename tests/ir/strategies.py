"""Hypothesis strategies: random well-typed IR modules, built from the op registry.

Every op is built the way a pass or the DSL builds it: attributes through the registry's
``make_attrs`` and result types from the op's ``infer``, so modules are well typed by
construction (and ``verify_module`` must accept them).

    from ir.strategies import modules          # tests/ is on sys.path (tests/conftest.py)

    @given(modules())
    def test_something(m): ...

Adding an op: write a builder that draws operands (reusing values in scope or adding
parameters), then calls ``ctx.emit``; register it with ``@op_builder("name")``. A new item kind
(tile-IR ``kernel``) adds an :class:`ItemKind` to ``ITEM_KINDS`` (a strategy for its
attributes, a rule for its returned values); then ``modules(kinds=("graph", "kernel"))`` builds
both. ``GRAPH_IR_OPS`` in test_roundtrip.py lists the ops that must have a builder.
"""
from __future__ import annotations

import math
import string
from dataclasses import dataclass, field
from typing import Any, Callable

from hypothesis import strategies as st

from fusionc.ir import Graph, Module, Op, Value, lookup
from fusionc.ir.registry import func_kind
from fusionc.ir.types import FLOAT_DTYPES, DType, TensorType

NAME_CHARS = string.ascii_letters + string.digits + "_."
SYMBOL_START = string.ascii_letters + "_"
# Names that are keywords, dtypes or literals elsewhere in the grammar: they must still work as
# value, graph and dimension names.
TRICKY_NAMES = ("B", "graph", "kernel", "return", "f16", "i32", "inf", "true", "false", "neox",
                "eps", "x.y", "_", "B.1")

value_names = st.one_of(st.text(NAME_CHARS, min_size=1, max_size=6),
                        st.sampled_from(("0", "1.5", "1e5") + TRICKY_NAMES))
symbol_names = st.one_of(
    st.builds(lambda a, b: a + b, st.sampled_from(SYMBOL_START), st.text(NAME_CHARS, max_size=5)),
    st.sampled_from(TRICKY_NAMES))
static_dims = st.one_of(st.sampled_from((1, 2, 3, 4, 8, 16, 64, 128)),
                        st.integers(1, 4096), st.integers(1, 2**62))

SPECIAL_FLOATS = (0.0, -0.0, 1e-5, 1e-6, 0.1, 1.0, 1e-300, 5e-324, 2.2250738585072014e-308,
                  1e300, 1.7976931348623157e308, math.inf, 123456789.125, 1 / 3)
FINITE = tuple(x for x in SPECIAL_FLOATS if math.isfinite(x))
nonneg_floats = st.one_of(st.sampled_from(FINITE),  # eps, theta, scale must be finite
                          st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
                          st.integers(0, 10**6))  # make_attrs turns ints into floats
pos_floats = st.one_of(st.sampled_from([x for x in FINITE if x > 0]),
                       st.floats(min_value=5e-324, allow_nan=False, allow_infinity=False))
F32_MAX = 3.4028234663852886e38
f32_pos_floats = pos_floats.filter(lambda x: x < F32_MAX)  # finite once rounded to fp32


@dataclass
class GraphCtx:
    """A graph under construction: values in scope, parameters, ops, symbolic dims.

    Builders call :meth:`pick` / :meth:`value` / :meth:`param` for operands and :meth:`emit` to
    add an op; ``draw`` is hypothesis' draw function.
    """

    draw: Callable[[st.SearchStrategy], Any]
    symbols: tuple[str, ...]
    kind: str = "graph"
    names: set[str] = field(default_factory=set)
    params: list[Value] = field(default_factory=list)
    body: list[Op] = field(default_factory=list)
    scope: list[Value] = field(default_factory=list)

    # -- names, dims, types
    def fresh(self) -> str:
        """A new value name, unique in this graph."""
        name = self.draw(value_names)
        while name in self.names:
            name += f".{len(self.names)}"
        self.names.add(name)
        return name

    def dim(self, static: bool = False) -> int | str:
        if static or not self.symbols or self.draw(st.booleans()):
            return self.draw(static_dims)
        return self.draw(st.sampled_from(self.symbols))

    def batch(self) -> int | str:
        """A batch dimension: usually symbolic."""
        if self.symbols and self.draw(st.integers(0, 3)):
            return self.draw(st.sampled_from(self.symbols))
        return self.draw(static_dims)

    def float_dtype(self) -> DType:
        return self.draw(st.sampled_from(FLOAT_DTYPES))

    def type(self, rank: int | None = None, dtype: DType | None = None) -> TensorType:
        if rank is None:
            rank = self.draw(st.integers(0, 4))
        dtype = dtype or self.draw(st.sampled_from(list(DType)))
        return TensorType(dtype, tuple(self.dim() for _ in range(rank)))

    # -- operands
    def param(self, t: TensorType) -> Value:
        """A new graph parameter of type ``t``."""
        v = Value(self.fresh(), t)
        self.params.append(v)
        self.scope.append(v)
        return v

    def pick(self, ok: Callable[[TensorType], bool], make: Callable[[], TensorType],
             avoid: str | None = None) -> Value:
        """A value in scope (not named ``avoid``) whose type satisfies ``ok``, or a new
        parameter of type ``make()``."""
        cands = [v for v in self.scope if ok(v.type) and v.name != avoid]
        if cands and self.draw(st.integers(0, 3)):
            return self.draw(st.sampled_from(cands))
        t = make()
        assert ok(t), t
        return self.param(t)

    def value(self, t: TensorType) -> Value:
        """A value of exactly type ``t``: one in scope, or a new parameter."""
        return self.pick(lambda u: u == t, lambda: t)

    def other(self, v: Value) -> Value:
        """A value of ``v``'s type other than ``v`` (a V cache beside a K cache)."""
        return self.pick(lambda u: u == v.type, lambda: v.type, avoid=v.name)

    def float_value(self, min_rank: int = 0, max_rank: int = 4) -> Value:
        return self.pick(lambda t: t.dtype in FLOAT_DTYPES and min_rank <= t.rank <= max_rank,
                         lambda: self.type(self.draw(st.integers(min_rank, max_rank)),
                                           self.float_dtype()))

    # -- ops
    def emit(self, name: str, operands, attrs: dict | None = None) -> tuple[Value, ...]:
        """Add op ``name``: attributes through ``make_attrs``, result types from ``infer``."""
        d = lookup(name)
        op = Op(name, (), tuple(operands), d.make_attrs(attrs or {}))
        results = tuple(Value(self.fresh(), t) for t in d.infer(op))
        self.body.append(op.replace(results=results))
        self.scope.extend(results)
        return results



def some_values(c: GraphCtx) -> list[Value]:
    """Outputs of a graph: a few values in scope (repeats allowed), possibly none."""
    return c.draw(st.lists(st.sampled_from(c.scope), max_size=3)) if c.scope else []


@dataclass(frozen=True)
class ItemKind:
    """How to finish an item of one kind (``graph``, ``kernel``): its attributes (a strategy
    of a dict given to the kind's ``make_attrs``) and its returned values."""

    attrs: st.SearchStrategy = st.just({})
    outputs: Callable[[GraphCtx], list[Value]] = some_values


Builder = Callable[[GraphCtx], None]
OP_BUILDERS: dict[str, Builder] = {}
ITEM_KINDS: dict[str, ItemKind] = {"graph": ItemKind()}


def op_builder(name: str) -> Callable[[Builder], Builder]:
    """Register the builder of op ``name`` (a function drawing operands and calling emit)."""
    def deco(fn: Builder) -> Builder:
        OP_BUILDERS[name] = fn
        return fn
    return deco


# ----------------------------------------------------------------------------------------------
# builders of the graph-IR ops


@op_builder("rms_norm")
def _rms_norm(c: GraphCtx) -> None:
    x = c.float_value(min_rank=1)
    w = c.value(TensorType(x.type.dtype, (x.type.shape[-1],)))
    c.emit("rms_norm", [x, w], {"eps": c.draw(nonneg_floats)})


@op_builder("linear")
def _linear(c: GraphCtx) -> None:
    x = c.float_value(min_rank=1)
    dt, n = x.type.dtype, c.dim()
    w = c.value(TensorType(dt, (n, x.type.shape[-1])))
    ops = [x, w]
    if c.draw(st.booleans()):
        ops.append(c.value(TensorType(dt, (n,))))
    c.emit("linear", ops)


def _binary(name: str) -> Builder:
    def build(c: GraphCtx) -> None:
        a = c.float_value()
        c.emit(name, [a, c.value(a.type)])
    return build


for _name in ("add", "mul", "silu_mul"):
    op_builder(_name)(_binary(_name))


@op_builder("silu")
def _silu(c: GraphCtx) -> None:
    c.emit("silu", [c.float_value()])


@op_builder("cast")
def _cast(c: GraphCtx) -> None:
    x = c.pick(lambda t: True, c.type)
    c.emit("cast", [x], {"dtype": c.draw(st.sampled_from([d.value for d in DType] + list(DType)))})


def _factor(c: GraphCtx, n: int) -> list[int]:
    """A random factorization of ``n`` into sizes >= 1 (ones included at random)."""
    out = []
    while n > 1 and len(out) < 4:
        divs = [d for d in (2, 3, 4, 8, 16, 128) if n % d == 0] or [n]
        f = c.draw(st.sampled_from(divs + [n]))
        out.append(f)
        n //= f
    if n > 1:
        out.append(n)
    out += [1] * c.draw(st.integers(0, 1))
    return out


@op_builder("reshape")
def _reshape(c: GraphCtx) -> None:
    x = c.pick(lambda t: True, c.type)
    static = math.prod(d for d in x.type.shape if isinstance(d, int))
    dims = _factor(c, static) + [d for d in x.type.shape if isinstance(d, str)]
    shape = c.draw(st.permutations(dims))
    c.emit("reshape", [x], {"shape": shape if c.draw(st.booleans()) else tuple(shape)})


@op_builder("split")
def _split(c: GraphCtx) -> None:
    x = c.pick(lambda t: any(isinstance(d, int) and d <= 64 for d in t.shape),
               lambda: c.type(0).with_shape((c.dim(), c.draw(st.integers(1, 64)))))
    axis = c.draw(st.sampled_from([i for i, d in enumerate(x.type.shape)
                                   if isinstance(d, int) and d <= 64]))
    n = x.type.shape[axis]
    cuts = sorted(c.draw(st.sets(st.integers(1, n - 1), max_size=3))) if n > 1 else []
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [n])]
    if c.draw(st.booleans()):
        axis -= x.type.rank
    c.emit("split", [x], {"axis": axis, "sizes": sizes})


def _heads_type(c: GraphCtx, dt: DType, d: int | None = None) -> TensorType:
    head_dim = d or 2 * c.draw(st.integers(1, 64))
    return TensorType(dt, (c.batch(), c.draw(st.sampled_from((1, 2, 4, 8, 32))), head_dim))


@op_builder("rope")
def _rope(c: GraphCtx) -> None:
    x = c.pick(lambda t: t.rank == 3 and t.dtype in FLOAT_DTYPES and isinstance(t.shape[2], int)
               and t.shape[2] >= 2, lambda: _heads_type(c, c.float_dtype()))
    pos = c.value(TensorType(DType.i32, (x.type.shape[0],)))
    attrs = {"theta": c.draw(pos_floats),
             "rotary_dim": 2 * c.draw(st.integers(1, x.type.shape[2] // 2))}
    style = c.draw(st.sampled_from([None, "neox", "gptj"]))
    if style:
        attrs["style"] = style
    c.emit("rope", [x, pos], attrs)


@op_builder("kv_cache_append")
def _kv_append(c: GraphCtx) -> None:
    kc = c.pick(lambda t: t.rank == 4 and t.dtype in FLOAT_DTYPES,
                lambda: TensorType(c.float_dtype(), (c.batch(), c.dim(), c.dim(), c.dim())))
    vc = c.other(kc)
    b, _, hkv, d = kc.type.shape
    k = c.value(TensorType(kc.type.dtype, (b, hkv, d)))
    v = c.value(k.type)
    c.emit("kv_cache_append", [kc, vc, k, v, c.value(TensorType(DType.i32, (b,)))])


@op_builder("decode_attention")
def _attention(c: GraphCtx) -> None:
    q = c.pick(lambda t: t.rank == 3 and t.dtype in FLOAT_DTYPES and isinstance(t.shape[1], int),
               lambda: _heads_type(c, c.float_dtype(), c.dim()))
    b, h, d = q.type.shape
    hkv = c.draw(st.sampled_from([g for g in range(1, min(h, 64) + 1) if h % g == 0] + [h]))
    kc = c.value(TensorType(q.type.dtype, (b, c.dim(), hkv, d)))
    vc = c.other(kc)
    lens = c.value(TensorType(DType.i32, (b,)))
    c.emit("decode_attention", [q, kc, vc, lens], {"scale": c.draw(pos_floats)})


@op_builder("all_reduce")
def _all_reduce(c: GraphCtx) -> None:
    c.emit("all_reduce", [c.float_value()], {"group": c.draw(st.sampled_from((1, 2, 4, 8))),
                                              "scope": c.draw(st.sampled_from(("nvlink", "nccl")))})


@op_builder("all_reduce_add_rms_norm")
def _all_reduce_add_rms_norm(c: GraphCtx) -> None:
    x = c.float_value(min_rank=1)
    res = c.value(x.type)
    w = c.value(TensorType(x.type.dtype, (x.type.shape[-1],)))
    c.emit("all_reduce_add_rms_norm", [x, res, w],
           {"group": c.draw(st.sampled_from((1, 2, 4, 8))), "eps": c.draw(pos_floats),
            "scope": c.draw(st.sampled_from(("nvlink", "nccl")))})


# ----------------------------------------------------------------------------------------------
# graphs and modules


def ops_for(kind: str) -> list[str]:
    """Names of the ops with a builder that may appear in an item of ``kind``."""
    return sorted(n for n, _ in OP_BUILDERS.items() if kind in lookup(n).where)


@st.composite
def graphs(draw, name: str | None = None, kind: str = "graph", ops: list[str] | None = None,
           max_ops: int = 8, symbols: tuple[str, ...] | None = None) -> Graph:
    """A random well-typed graph (or kernel) using ``ops`` (default: every op with a builder
    allowed in ``kind``)."""
    if symbols is None:
        symbols = tuple(draw(st.lists(symbol_names, max_size=3, unique=True)))
    c = GraphCtx(draw, symbols, kind)
    for _ in range(draw(st.integers(0, 2))):
        c.param(c.type())
    names = ops if ops is not None else ops_for(kind)
    for _ in range(draw(st.integers(0, max_ops)) if names else 0):
        OP_BUILDERS[draw(st.sampled_from(names))](c)
    spec = ITEM_KINDS[kind]
    attrs = func_kind(kind).make_attrs(draw(spec.attrs))
    return Graph(name or draw(symbol_names), tuple(c.params), tuple(c.body),
                 tuple(spec.outputs(c)), kind, attrs)


@st.composite
def modules(draw, kinds: tuple[str, ...] = ("graph",), max_graphs: int = 3, **kw) -> Module:
    """A random well-typed module of 1..``max_graphs`` items with unique names."""
    names = draw(st.lists(symbol_names, min_size=1, max_size=max_graphs, unique=True))
    return Module(tuple(draw(graphs(name=n, kind=draw(st.sampled_from(kinds)), **kw))
                        for n in names))


@op_builder("head_linear")
def _head_linear(c: GraphCtx) -> None:
    x = c.float_value(min_rank=3, max_rank=3)
    c.emit("head_linear", [x, c.value(TensorType(x.type.dtype, (x.type.shape[1], c.dim(),
                                                                 x.type.shape[2])))])


@op_builder("latent_cache_append")
def _latent_cache_append(c: GraphCtx) -> None:
    dt, b, lat, rope = c.float_dtype(), c.dim(), c.draw(st.integers(1, 64)), c.draw(
        st.integers(1, 16))
    cache = c.value(TensorType(dt, (b, c.dim(), lat + rope)))
    c.emit("latent_cache_append", [cache, c.value(TensorType(dt, (b, lat))),
                                   c.value(TensorType(dt, (b, rope))),
                                   c.value(TensorType(DType.i32, (b,)))])


@op_builder("mla_decode_attention")
def _mla_decode_attention(c: GraphCtx) -> None:
    dt, b, h, lat, rope = (c.float_dtype(), c.dim(), c.dim(), c.draw(st.integers(1, 64)),
                           c.draw(st.integers(1, 16)))
    c.emit("mla_decode_attention", [c.value(TensorType(dt, (b, h, lat))),
                                    c.value(TensorType(dt, (b, h, rope))),
                                    c.value(TensorType(dt, (b, c.dim(), lat + rope))),
                                    c.value(TensorType(DType.i32, (b,)))],
           {"scale": c.draw(f32_pos_floats)})
