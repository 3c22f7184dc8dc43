"""Executable specs in numpy: the graph-IR interpreter (``interpreter.interpret``) and the
numerics they share (``numerics``). ``interpret`` is imported on first use."""


def __getattr__(name):
    if name in ("interpret", "Context", "bind_inputs"):
        from fusionc.interp import interpreter
        return getattr(interpreter, name)
    raise AttributeError(f"module 'fusionc.interp' has no attribute '{name}'")
