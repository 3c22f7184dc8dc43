"""Subcommands of the ``fusionc`` command line, one module each."""
from fusionc.commands import (cache, compile, generate, ir, launch, random_model,  # noqa: F401
                              run, tune)
