"""Pass base class and registry.

A pass is a small frozen dataclass with a ``name`` (as written in pipeline strings), option
fields and the passes it ``requires`` before it; ``run(module) -> module`` returns new IR
(nodes are immutable). Passes register
themselves with :func:`register_pass`; the pipeline parser looks them up by name.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from fusionc.ir.nodes import Module

PASSES: dict[str, type["Pass"]] = {}


@dataclasses.dataclass(frozen=True)
class Pass:
    """Base of all passes. Subclasses set ``name`` and define ``run``."""

    name: ClassVar[str] = ""
    # passes one of which must come earlier in a pipeline run on graph IR (a module that
    # already holds kernels may have run them before): checked by run_pipeline
    requires: ClassVar[tuple[str, ...]] = ()

    def run(self, module: Module) -> Module:  # pragma: no cover - abstract
        raise NotImplementedError

    def spec(self) -> str:
        """This pass as written in a pipeline string, options included."""
        opts = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default]
        return self.name + ("{" + ",".join(opts) + "}" if opts else "")


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make ``cls`` available in pipeline strings under ``cls.name``."""
    PASSES[cls.name] = cls
    return cls
