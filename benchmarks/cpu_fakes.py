"""A fake GPU for running :class:`fusionc.runtime.compiled.CompiledGraph` calls on a machine
without one (the CPU host-overhead harness, ``benchmarks/host_overhead_cpu.py``, and the tests of
the cached call path, ``tests/runtime/test_call_cache.py``).

What is faked, for as long as :func:`fake_gpu` is active:

* CuPy's device, stream and runtime queries (``cupy.cuda.Device``, ``get_current_stream``,
  ``runtime.getDevice`` / ``getDeviceCount`` / ``streamIsCapturing``) and its allocations
  (``cupy.empty`` / ``cupy.zeros`` give real ``cupy.ndarray`` objects over made-up device
  addresses: shapes, strides, flags and ``.data.ptr`` behave, the bytes are never touched);
* the CUDA driver of :mod:`fusionc.runtime.launch` (module load, attributes, occupancy, and a
  ``cuLaunchKernelEx`` that converts its kernel arguments as the real call does, records the
  launch and returns success);
* cuBLAS (:mod:`fusionc.runtime.library`: every call succeeds, nothing runs);
* PyTorch: a ``torch`` module (in ``sys.modules`` in place of the real one, if any) with
  dtypes, ``empty`` and the stream queries fusionc makes, and :class:`FakeTensor`
  (``is_torch`` holds for it).

Only the Python path of a call is real; the CPU figures measured with it leave out the driver's
own launch cost and PyTorch's C++ tensor attribute costs.
"""
from __future__ import annotations

import contextlib
import ctypes
import sys
import types

_DTYPES = ("float16", "bfloat16", "float32", "int32", "int64", "float64", "uint16")
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "int32": 4, "int64": 8, "float64": 8,
             "uint16": 2}


class FakeDType:
    """A torch dtype stand-in: ``str()`` is ``torch.<name>``."""

    def __init__(self, name: str):
        self.name, self.itemsize = name, _ITEMSIZE[name]

    def __repr__(self):
        return "torch." + self.name

    __str__ = __repr__


class FakeDevice:
    """``torch.device`` and ``cupy.cuda.Device`` stand-in (``cuda:0`` unless told)."""

    compute_capability = "90"
    attributes = {"MultiProcessorCount": 132}

    def __init__(self, kind="cuda", index=None):
        if isinstance(kind, int):
            kind, index = "cuda", kind
        self.type, self.index = kind, (0 if index is None and kind == "cuda" else index)
        self.id = self.index

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeTensor:
    """A PyTorch CUDA tensor stand-in over a made-up address (``fusionc.runtime.arrays.is_torch``
    is true for it). ``contiguous=False`` makes a strided view."""

    def __init__(self, shape, dtype, ptr=None, device=0, contiguous=True):
        self.shape = tuple(shape)
        self.dtype = dtype if isinstance(dtype, FakeDType) else FAKE_TORCH_DTYPES[dtype]
        self._ptr = alloc_address(self.numel() * self.dtype.itemsize) if ptr is None else ptr
        self.device = FakeDevice("cpu") if device is None else FakeDevice("cuda", device)
        self.is_cuda = device is not None
        self._contiguous = contiguous

    def data_ptr(self):
        return self._ptr

    def is_contiguous(self):
        return self._contiguous

    def get_device(self):
        return -1 if self.device.index is None else self.device.index

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def element_size(self):
        return self.dtype.itemsize

    def stride(self):
        out, s = [], 1
        for d in reversed(self.shape):
            out.append(s)
            s *= d
        out = tuple(reversed(out))
        return out if self._contiguous else tuple(2 * x for x in out)

    def cpu(self):
        return FakeTensor(self.shape, self.dtype, self._ptr, None)

    # the view CompiledGraph.scratch takes: flat[:n].reshape(shape)
    def __getitem__(self, key):
        return FakeTensor((key.stop,), self.dtype, self._ptr)

    def reshape(self, shape):
        return FakeTensor(shape, self.dtype, self._ptr)

    def __repr__(self):
        return f"FakeTensor({list(self.shape)}, {self.dtype}, {self._ptr:#x})"


FakeTensor.__module__ = "torch.fake"  # what fusionc.runtime.arrays.is_torch looks at
FAKE_TORCH_DTYPES = {n: FakeDType(n) for n in _DTYPES}

_NEXT = [1 << 32]


def alloc_address(nbytes: int, align: int = 256) -> int:
    """A fresh made-up device address (``align``-byte aligned), never reused."""
    p = _NEXT[0]
    _NEXT[0] = p + max(-(-nbytes // align) * align, align)
    return p


def fake_cupy_array(shape, dtype, ptr=None, device=0):
    """A real ``cupy.ndarray`` over a made-up address on GPU ``device`` (its bytes must never
    be touched)."""
    import cupy
    dtype = cupy.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    n = dtype.itemsize
    for d in shape:
        n *= d
    ptr = alloc_address(n) if ptr is None else ptr
    mem = cupy.cuda.UnownedMemory(ptr, max(n, 1), None, device_id=device)
    return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))


class FakeStream:
    """A CuPy stream stand-in (handle ``ptr``; never capturing unless told)."""

    def __init__(self, ptr=0):
        self.ptr, self.capturing = ptr, False

    def is_capturing(self):
        return self.capturing

    def wait_event(self, ev):
        pass

    def record(self, ev=None):
        pass

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeEvent:
    def __init__(self, *a, **k):
        pass

    def record(self, stream=None):
        pass


STREAM = FakeStream()


def fake_driver():
    """A namespace with every name of ``cuda.bindings.driver`` (its structs are real) whose
    calls into the driver succeed without one; ``launches`` counts ``cuLaunchKernelEx`` calls
    and ``last`` holds the latest ``(config, function, kernelParams)``."""
    from cuda.bindings import driver as real
    ns = types.SimpleNamespace(**{n: getattr(real, n) for n in dir(real)
                                  if not n.startswith("__")})
    ok = real.CUresult.CUDA_SUCCESS
    helper = getattr(real, "_HelperKernelParams", None)
    ns.launches, ns.last = 0, None

    def launch(cfg, f, params, extra):
        if helper is not None:
            helper(params)  # the argument conversion the real call makes
        ns.launches += 1
        ns.last = (cfg, f, params)
        return (ok,)

    ns.cuLaunchKernelEx = launch
    ns.cuModuleLoadData = lambda cubin: (ok, object())
    ns.cuModuleGetFunction = lambda m, name: (ok, real.CUfunction())
    ns.cuFuncSetAttribute = lambda *a: (ok,)
    ns.cuDriverGetVersion = lambda: (ok, 13000)
    ns.cuOccupancyMaxActiveClusters = lambda f, cfg: (ok, 1 << 20)
    ns.cuOccupancyMaxActiveBlocksPerMultiprocessor = lambda f, t, s: (ok, 64)
    ns.cuCtxGetStreamPriorityRange = lambda: (ok, 0, -5)
    ns.cuTensorMapEncodeTiled = lambda *a: (ok, real.CUtensorMap())   # v2 kernels' TMA maps
    return ns


def launched_args(params, kinds) -> list[int]:
    """The integer values of kernel arguments ``params`` (as given to ``cuLaunchKernelEx``:
    an address of ``void*`` slots, or a ``(values, types)`` pair) for parameter ``kinds``
    (``KernelParam.kind`` of each)."""
    if isinstance(params, tuple):
        return [int(v) for v in params[0]]
    slots = (ctypes.c_void_p * len(kinds)).from_address(params)
    size = {"dim": ctypes.c_int, "delay_rank": ctypes.c_int, "delay_ns": ctypes.c_ulonglong}
    return [size.get(k, ctypes.c_uint64).from_address(slots[i]).value
            for i, k in enumerate(kinds)]


def _fake_torch_module():
    torch = types.ModuleType("torch")
    torch.__path__ = []
    for n, d in FAKE_TORCH_DTYPES.items():
        setattr(torch, n, d)
    torch.Tensor = FakeTensor
    torch.device = FakeDevice
    torch.empty = lambda shape, dtype=None, device=None: FakeTensor(
        shape, dtype, device=device.index if isinstance(device, FakeDevice) else 0)
    cuda = types.ModuleType("torch.cuda")
    cuda.current_stream = lambda device=None: types.SimpleNamespace(cuda_stream=STREAM.ptr)
    cuda.current_device = lambda: 0
    cuda.is_current_stream_capturing = lambda: STREAM.capturing
    torch.cuda = cuda
    c = types.ModuleType("torch._C")
    c._cuda_getCurrentRawStream = lambda device: STREAM.ptr
    c._cuda_getDevice = lambda: 0
    torch._C = c
    return {"torch": torch, "torch.cuda": cuda, "torch._C": c}


@contextlib.contextmanager
def fake_gpu(torch: bool = True):
    """Fake the GPU (see the module docstring) inside the ``with`` block; yields the fake
    driver. ``torch``: put the fake ``torch`` module in ``sys.modules`` meanwhile."""
    import cupy

    from fusionc.runtime import arrays, launch, library, row_kernels
    cu = fake_driver()
    lib = types.SimpleNamespace(cublasCreate_v2=lambda h: 0, cublasSetStream_v2=lambda h, s: 0,
                                cublasGemmEx=lambda *a: 0)
    patches = [(cupy.cuda, "Device", FakeDevice), (cupy.cuda, "get_current_stream", lambda: STREAM),
               (cupy.cuda, "Event", FakeEvent),
               (cupy.cuda, "ExternalStream", lambda ptr, *a: STREAM if ptr == STREAM.ptr
                else FakeStream(ptr)),
               (cupy.cuda, "Stream", lambda *a, **k: FakeStream(alloc_address(1))),
               (cupy.cuda.runtime, "getDevice", lambda: 0),
               (cupy.cuda.runtime, "getDeviceCount", lambda: 1),
               (cupy.cuda.runtime, "streamIsCapturing", lambda s: int(STREAM.capturing)),
               (cupy, "empty", lambda shape, dtype=float, order="C": fake_cupy_array(shape, dtype)),
               (cupy, "zeros", lambda shape, dtype=float, order="C": fake_cupy_array(shape, dtype)),
               (launch, "driver", lambda: cu), (launch, "ensure_device", lambda: None),
               (launch, "_sm_count", lambda: 132), (library, "_cublas", lambda: lib)]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    modules = _fake_torch_module() if torch else {}
    old_modules = {k: sys.modules.get(k) for k in modules}
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        sys.modules.update(modules)
        library._HANDLES.clear()
        row_kernels.clear()        # row kernels loaded through the fake driver (and after)
        arrays._EXTERNAL.clear()   # CuPy wrappers of (fake) torch streams
        yield cu
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        for k, v in old_modules.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        library._HANDLES.clear()
        row_kernels.clear()
        arrays._EXTERNAL.clear()
        STREAM.capturing = False
