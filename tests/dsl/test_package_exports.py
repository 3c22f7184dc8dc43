"""``import fusionc`` alone gives the lazy exports and the subpackages the README uses."""
from __future__ import annotations

import subprocess
import sys


def test_subpackages_after_a_bare_import():
    code = ("import fusionc\n"
            "assert callable(fusionc.passes.run_pipeline)\n"
            "assert callable(fusionc.ir.print_module) and callable(fusionc.ir.parse_module)\n"
            "assert 'passes' in dir(fusionc)\n"
            "try:\n"
            "    fusionc.nope\n"
            "except AttributeError as e:\n"
            "    assert 'nope' in str(e)\n"
            "else:\n"
            "    raise SystemExit('no AttributeError')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
