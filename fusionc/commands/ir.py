"""``fusionc ir``: print the IR of a DSL example or an IR text file."""
from __future__ import annotations

from fusionc.cli import command


@command("ir", "print the IR of an example (.py) or re-print an IR file (.fir)")
def setup(p):
    p.add_argument("source", help="a DSL file (.py) or IR text (.fir)")

    def run(args):
        from fusionc.ir import parse_file, print_module
        print(print_module(parse_file(args.source)), end="")
        return 0
    return run
