"""GPU tests: print a table of what ran (case, numbers) at the end of the session."""
from __future__ import annotations

from tests.gpu.common import RESULTS

try:   # PyTorch first, where it is installed: imported late in a session (after CuPy and the
    import torch  # noqa: F401   # compiled kernels) torch 2.11's import failed to parse its
except Exception:  # noqa: BLE001  # own custom-op schemas (H200 machine, 2026-12-02)
    pass


def pytest_terminal_summary(terminalreporter):
    if not RESULTS:
        return
    tr = terminalreporter
    w = [max(len(r[i]) for r in RESULTS) for i in range(3)]
    tr.section("fusionc GPU results")
    tr.write_line(f"{'test':<{w[0]}}  {'case':<{w[1]}}  outcome")
    for t, c, o in RESULTS:
        tr.write_line(f"{t:<{w[0]}}  {c:<{w[1]}}  {o}")
