"""Subcommands of the ``fusionc`` command line, one module each."""
from fusionc.commands import compile, generate, ir, run, tune  # noqa: F401
