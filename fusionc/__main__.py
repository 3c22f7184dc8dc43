"""``python -m fusionc``: the command-line interface (see :mod:`fusionc.cli`)."""
import sys

from fusionc.cli import main

sys.exit(main())
