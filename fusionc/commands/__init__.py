"""Subcommands of the ``fusionc`` command line, one module each."""
from fusionc.commands import (compile, generate, ir, launch, random_model, run,  # noqa: F401
                              tune)
