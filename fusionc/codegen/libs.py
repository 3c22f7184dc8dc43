"""The device-helper libraries (``templates/lib/*.cuh.j2``) a kernel includes, in a fixed order."""
from __future__ import annotations

from fusionc.codegen.render import render

ORDER = ("common", "mma", "gemv", "gemv_mma", "attention", "stream", "wgmma", "stream_flush")
DEPS = {"gemv_mma": ("mma", "gemv"), "stream": ("mma",),
        "wgmma": ("stream",),
        "stream_flush": ("stream",)}  # libraries that use another's helpers


def render_libs(needed: set[str], delay: bool = False) -> list[str]:
    """The text of each needed library and of the libraries it uses, dependencies first."""
    unknown = needed - set(ORDER)
    if unknown:
        raise ValueError(f"unknown codegen libraries {sorted(unknown)}")
    needed = needed | {"common"} | {d for lib in needed for d in DEPS.get(lib, ())}
    return [render(f"lib/{name}.cuh.j2", delay=delay) for name in ORDER if name in needed]
