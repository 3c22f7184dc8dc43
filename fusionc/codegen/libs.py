"""The device-helper libraries (``templates/lib/*.cuh.j2``) a kernel includes, in a fixed order."""
from __future__ import annotations

from fusionc.codegen.render import render

ORDER = ("common", "gemv", "attention", "mla")


def render_libs(needed: set[str], delay: bool = False) -> list[str]:
    """The text of each needed library, dependencies first."""
    unknown = needed - set(ORDER)
    if unknown:
        raise ValueError(f"unknown codegen libraries {sorted(unknown)}")
    return [render(f"lib/{name}.cuh.j2", delay=delay) for name in ORDER if name in needed]
