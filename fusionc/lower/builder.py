"""KernelBuilder: emit tile-IR ops with fresh SSA names and types from the op registry."""
from __future__ import annotations

from contextlib import contextmanager

from fusionc.errors import Loc
from fusionc.ir.nodes import Graph, Op, Value
from fusionc.ir.registry import lookup
from fusionc.ir.types import DType, TensorType


class KernelBuilder:
    """Builds one ``kernel`` item.

    ``param`` declares global tensors (deduplicated by name); ``op`` appends an op whose result
    types come from the op's inference rule unless ``types`` is given; ``when`` opens a
    conditional region; ``build`` returns the kernel Graph.
    """

    def __init__(self, name: str, loc: Loc | None = None):
        self.name, self.loc = name, loc
        self.params: dict[str, Value] = {}
        self.outputs: list[Value] = []
        self.pure: list[Value] = []  # outputs that are not inputs, allocated by the runtime
        self._ops: list[list[Op]] = [[]]
        self._count = 0

    def param(self, v: Value) -> Value:
        """Declare graph value ``v`` as a kernel parameter (same name and type)."""
        if v.name not in self.params:
            self.params[v.name] = v
        return self.params[v.name]

    def output(self, v: Value, pure: bool = False) -> Value:
        """Mark ``v`` as written by the kernel (returned): an input updated in place, or a
        ``pure`` output that the runtime allocates (placed after all inputs)."""
        if pure:
            self.pure.append(v)
        else:
            self.param(v)
        if all(o.name != v.name for o in self.outputs):
            self.outputs.append(v)
        return v

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def op(self, name: str, *operands: Value, types: list[TensorType] | None = None,
           hint: str = "t", loc: Loc | None = None, **attrs):
        """Append op ``name``; returns its result (one), a tuple (several) or None."""
        d = lookup(name)
        attrs_t = d.make_attrs(attrs, loc or self.loc)
        probe = Op(name, (), tuple(operands), attrs_t, (), loc or self.loc)
        if types is None:
            types = list(d.infer(probe))
        results = tuple(Value(self.fresh(hint), t) for t in types)
        self._ops[-1].append(Op(name, results, tuple(operands), attrs_t, (), loc or self.loc))
        if not results:
            return None
        return results[0] if len(results) == 1 else results

    def smem(self, t: TensorType, hint: str = "buf") -> Value:
        """A shared-memory buffer of type ``t``."""
        return self.op("smem_alloc", types=[t], hint=hint)

    @contextmanager
    def when(self, on: str, lo: int, hi: int):
        """Ops emitted inside run only on CTAs with lo <= rank (or cluster) < hi."""
        self._ops.append([])
        yield
        body = self._ops.pop()
        self._ops[-1].append(Op("when", (), (), lookup("when").make_attrs(
            {"on": on, "lo": lo, "hi": hi}), (tuple(body),), self.loc))

    def build(self, **attrs) -> Graph:
        """The kernel with launch attributes ``attrs`` (grid, cluster, threads, max_batch)."""
        from fusionc.ir.registry import func_kind
        ordered = list(self.params.values()) + self.pure
        if attrs.get("cluster") == 16:
            attrs.setdefault("nonportable", True)
        return Graph(self.name, tuple(ordered), tuple(self._ops[0]), tuple(self.outputs),
                     "kernel", func_kind("kernel").make_attrs(attrs, self.loc), self.loc)


def f32(t: TensorType) -> TensorType:
    return t.with_dtype(DType.f32)
