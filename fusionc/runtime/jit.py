"""``@fusionc.jit``: trace a function like ``@fusionc.graph`` and compile it for the GPU on the
first call — the notebook-friendly spelling of ``fusionc.compile(fusionc.graph(fn))``, in the
manner of ``triton.jit`` / ``torch.compile``."""
from __future__ import annotations

from fusionc.ir.nodes import Module


def jit(fn=None, /, *, name: str | None = None, **kwargs):
    """Decorator: ``@fusionc.jit`` or ``@fusionc.jit(max_batch=4, kv_len=1024)``.

    The function is traced at once (DSL errors surface at the decorator, with the DSL line);
    kernels are compiled on the first call (or by :meth:`JitGraph.compile`, which needs no GPU)
    and reused. Keyword arguments named like :func:`fusionc.compile`'s options (``max_batch``,
    ``kv_len``, ``pipeline``, ``codegen``, ``autotune``, ``pdl``, ...) go to it
    unchanged (its defaults apply otherwise); the others declare parameter types as in
    ``@fusionc.graph``.

    Returns:
        A :class:`JitGraph`: call it like the compiled graph (CuPy arrays or torch tensors).
    Raises:
        DSLError at decoration; PassError, LoweringError, CompileError at the first call.
    """
    import inspect

    from fusionc.runtime.compiled import compile as compile_
    known = set(inspect.signature(compile_).parameters) - {"program", "graph", "progress"}
    opts = {k: v for k, v in kwargs.items() if k in known}
    inputs = {k: v for k, v in kwargs.items() if k not in known}

    def wrap(f):
        from fusionc.dsl.graph import graph
        return JitGraph(graph(f, name=name, **inputs), opts)
    return wrap if fn is None else wrap(fn)


class JitGraph:
    """A traced graph (:attr:`graph`, a one-graph Module) compiled lazily with fixed options
    (:attr:`options`)."""

    def __init__(self, graph: Module, options: dict):
        self.graph, self.options, self._compiled = graph, options, None

    def compile(self):
        """The :class:`fusionc.runtime.compiled.CompiledGraph` (compiled once; no GPU needed)."""
        if self._compiled is None:
            from fusionc.runtime.compiled import compile
            self._compiled = compile(self.graph, **self.options)
        return self._compiled

    def __call__(self, *args, **kwargs):
        return self.compile()(*args, **kwargs)

    def _repr_html_(self) -> str:
        from fusionc.display import compiled_html, module_html
        return compiled_html(self._compiled) if self._compiled else module_html(self.graph)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(f"jit(@{self.graph.graphs[0].name}, {self.options}, "
               f"{'compiled' if self._compiled else 'not compiled yet'})")

    def __repr__(self) -> str:
        from fusionc.display import signature
        opts = "".join(f", {k}={v!r}" for k, v in self.options.items())
        state = (f"kernels {', '.join(self._compiled.kernels) or 'none'}" if self._compiled
                 else "not compiled yet")
        return f"<JitGraph {signature(self.graph.graphs[0])}{opts}: {state}>"
