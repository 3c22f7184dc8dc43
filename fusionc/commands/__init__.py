"""Subcommands of the ``fusionc`` command line, one module each."""
from fusionc.commands import compile, ir, run, tune  # noqa: F401
