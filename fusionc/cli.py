"""The ``fusionc`` command line. Subcommands register themselves in :data:`COMMANDS`.

User mistakes surface as one ``fusionc`` error line (exit status 1), never a traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from fusionc.errors import FusionError

# name -> (help, add_arguments(parser), run(args) -> exit status)
COMMANDS: dict[str, tuple[str, Callable, Callable]] = {}


def command(name: str, help: str):
    """Decorator pair: ``@command("ir", "...")`` on a function ``(subparser) -> run``."""
    def wrap(setup):
        COMMANDS[name] = (help, setup)
        return setup
    return wrap


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    from fusionc import commands  # noqa: F401  (registers the subcommands)
    import fusionc
    p = argparse.ArgumentParser(prog="fusionc", description=(
        "Compile fused kernels for LLM decode on NVIDIA Hopper (sm_90a)."))
    p.add_argument("--version", action="version", version=f"fusionc {fusionc.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help, setup) in COMMANDS.items():
        sp = sub.add_parser(name, help=help, description=help)
        sp.set_defaults(run=setup(sp))
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except FusionError as e:
        print(f"fusionc: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
