"""Compile CUDA C++ to a cubin with NVRTC, without needing a GPU.

NVRTC is called directly through `cuda.bindings.nvrtc` (CuPy's `RawModule(code=...)` needs a GPU
and picks its own arch). Headers come from the pip packages of `cuda-toolkit[cudart,nvrtc,cccl]`:
`<site-packages>/nvidia/cu13/include` and its `cccl/` subfolder. `-Xptxas=-v` output is parsed
into per-kernel registers, static shared memory and spills.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import re
from dataclasses import dataclass, field

from fusionc.errors import CompileError

DEFAULT_OPTIONS: tuple[str, ...] = ("-std=c++17", "-Xptxas=-v", "-lineinfo")


class NVRTCError(CompileError):
    """NVRTC could not compile a program (the message holds NVRTC's log) or is unusable.

    A :class:`fusionc.errors.CompileError`, so the command line prints it as one error.
    """

    def __init__(self, message: str, log: str = "", **where) -> None:
        super().__init__(message, **where)
        self.log = log

    def with_loc(self, loc):  # keep the log when a location is added
        out = super().with_loc(loc)
        out.log = self.log
        return out


@dataclass(frozen=True)
class KernelStats:
    """Resource usage of one entry function as reported by ptxas (-Xptxas=-v)."""

    name: str
    registers: int = 0
    smem: int = 0  # static shared memory, bytes
    stack: int = 0  # stack frame, bytes
    spill_stores: int = 0  # bytes
    spill_loads: int = 0  # bytes

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


@dataclass(frozen=True)
class CompileResult:
    """A compiled cubin, NVRTC's log and the parsed per-kernel statistics."""

    cubin: bytes
    log: str
    kernels: dict[str, KernelStats] = field(default_factory=dict)
    options: tuple[str, ...] = ()

    @property
    def registers(self) -> dict[str, int]:
        return {k: s.registers for k, s in self.kernels.items()}

    @property
    def smem(self) -> dict[str, int]:
        return {k: s.smem for k, s in self.kernels.items()}

    @property
    def spills(self) -> dict[str, int]:
        return {k: s.spills for k, s in self.kernels.items()}


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise NVRTCError(
            f"cuda-bindings is not installed ({e}); pip install 'cuda-bindings>=13.0,<14'"
        ) from e
    return nvrtc


def _check(result, what: str):
    """Unpack a cuda.bindings return tuple, raising NVRTCError on a non-success status."""
    nvrtc = _nvrtc()
    err, *rest = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise NVRTCError(f"{what} failed: {msg.decode() if isinstance(msg, bytes) else msg}")
    return rest[0] if len(rest) == 1 else tuple(rest)


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library that compile_cubin uses."""
    return tuple(_check(_nvrtc().nvrtcVersion(), "nvrtcVersion"))


def _header_dir(libname: str, subpath: str, probe: str) -> pathlib.Path | None:
    """Locate a CUDA header folder: cuda.pathfinder first, then the `nvidia` namespace package."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory(libname)
        if found and (pathlib.Path(found) / probe).exists():
            return pathlib.Path(found)
    except Exception:  # older pathfinder or unknown name: fall back to the package layout
        pass
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = pathlib.Path(root, subpath)
        if (candidate / probe).exists():
            return candidate
    return None


@functools.lru_cache(maxsize=1)
def include_dirs() -> tuple[str, ...]:
    """Include folders for NVRTC: the CUDA runtime headers and CCCL (libcu++, CUB, Thrust)."""
    cudart = _header_dir("cudart", "cu13/include", "cuda_fp16.h")
    cccl = _header_dir("cccl", "cu13/include/cccl", "cuda/std/cstdint")
    missing = [n for n, d in (("cudart", cudart), ("cccl", cccl)) if d is None]
    if missing:
        raise NVRTCError(
            f"CUDA headers not found ({', '.join(missing)}); "
            "pip install 'cuda-toolkit[cudart,nvrtc,cccl]==13.0.*'"
        )
    return (str(cudart), str(cccl))


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_log(log: str) -> dict[str, KernelStats]:
    """Per-entry-function statistics from ptxas `-v` output (device functions are skipped)."""
    stats: dict[str, dict[str, int]] = {}
    entry = props = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            stats.setdefault(entry, {})
        elif m := _PROPS.search(line):
            props = m.group(1)
        elif (m := _FRAME.search(line)) and props in stats:
            stats[props].update(stack=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
        elif (m := _USED.search(line)) and entry is not None:
            smem = _SMEM.search(line)
            stats[entry].update(registers=int(m[1]), smem=int(smem[1]) if smem else 0)
    return {name: KernelStats(name, **s) for name, s in stats.items()}


def compile_cubin(
    source: str,
    name: str = "kernel.cu",
    arch: str = "sm_90a",
    options: tuple[str, ...] = (),
) -> CompileResult:
    """Compile `source` with NVRTC to a cubin for `arch` (a real arch such as sm_90a).

    Options used: `-arch=<arch>`, the include folders of `include_dirs()`, DEFAULT_OPTIONS
    (`-std=c++17 -Xptxas=-v -lineinfo`), then `options`. Raises NVRTCError with the log on failure.
    """
    if not arch.startswith("sm_"):
        raise NVRTCError(
            f"arch must be a real GPU arch such as 'sm_90a' to get a cubin, not {arch!r}"
        )
    nvrtc = _nvrtc()
    opts = (f"-arch={arch}", *(f"-I{d}" for d in include_dirs()), *DEFAULT_OPTIONS, *options)
    prog = _check(
        nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram"
    )
    try:
        encoded = [o.encode() for o in opts]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = b" " * size
        _check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.rstrip(b"\0 \n").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NVRTCError(
                f"NVRTC failed to compile {name} for {arch} ({status.name}):\n{log}", log
            )
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CompileResult(cubin=cubin, log=log, kernels=parse_ptxas_log(log), options=opts)
