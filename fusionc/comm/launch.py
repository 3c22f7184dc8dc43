"""Launching a compiled all-reduce kernel (``cuLaunchKernelEx`` through cuda-bindings)."""
from __future__ import annotations

import ctypes

_LOADED: dict = {}


def _function(result, spec):
    """The kernel's CUfunction, loaded once per process and context."""
    import cupy

    from fusionc.runtime.launch import check, driver
    key = (spec, cupy.cuda.Device().id)
    if key not in _LOADED:
        cu = driver()
        module = check(cu.cuModuleLoadData(result.cubin), "cuModuleLoadData")
        _LOADED[key] = (module, check(cu.cuModuleGetFunction(module, spec.name.encode()),
                                      "cuModuleGetFunction"))
    return _LOADED[key][1]


def launch(result, spec, stream, *, ctas: int, x: int, args, rank: int, bases: list[int],
           flag_bytes: int, slot_bytes: int, epochs: int, error: int, timeout_ns: int) -> None:
    """Launch ``spec`` on ``stream`` over ``ctas`` CTAs (parameters as in the template).

    ``bases[r]`` is rank r's region (flags at 0, data slots from ``flag_bytes``), mapped into
    this process; ``slot_bytes`` is the size of one slot.
    """
    from fusionc.runtime.launch import check, driver
    cu = driver()
    P, I, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    vals = [(x, P), (args.residual or 0, P), (args.weight or 0, P), (args.y_ptr or 0, P),
            (args.h_ptr, P), (args.tokens, I), (float(args.eps), F), (rank, I)]
    for b in bases:
        vals += [(b + flag_bytes if b else 0, P), (b, P)]
    own = bases[rank]
    vals += [(own + flag_bytes if own else 0, P), (own, P),
             (slot_bytes // spec.itemsize, ctypes.c_longlong), (epochs, P), (error, P),
             (timeout_ns, ctypes.c_ulonglong)]
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = ctas, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = spec.threads, 1, 1
    cfg.sharedMemBytes = 0
    cfg.hStream = cu.CUstream(stream.ptr)
    check(cu.cuLaunchKernelEx(cfg, _function(result, spec),
                              (tuple(v for v, _ in vals), tuple(t for _, t in vals)), 0),
          f"launching {spec.name}")
