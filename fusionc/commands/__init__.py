"""Subcommands of the ``fusionc`` command line, one module each."""
from fusionc.commands import compile, generate, ir, launch, run, tune  # noqa: F401
