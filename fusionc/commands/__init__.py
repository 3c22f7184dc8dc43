"""Subcommands of the ``fusionc`` command line, one module each."""
from fusionc.commands import ir  # noqa: F401
