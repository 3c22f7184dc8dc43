"""compute-sanitizer memcheck over whole decode steps (scripts/check_decoder.py): no
out-of-bounds or misaligned access in fusionc's kernels or the head. Regression: a
non-volatile streaming load was hoisted above its bounds check and read past the end of the
Qwen3 gate/up weights."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.common import record

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("arch,dtype", [("qwen3", "f16"), ("llama", "bf16")])
def test_decode_steps_are_memcheck_clean(arch, dtype):
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(tool):
        pytest.skip("compute-sanitizer is not installed")
    r = subprocess.run([tool, "--tool", "memcheck", "--report-api-errors", "no",
                        sys.executable, str(ROOT / "scripts" / "check_decoder.py"), "--arch",
                        arch, "--dtype", dtype, "--steps", "2"],
                       capture_output=True, text=True, timeout=300, env=os.environ | {
                           "PYTHONPATH": os.pathsep.join(sys.path)})
    summary = [line for line in r.stdout.splitlines() if "ERROR SUMMARY" in line]
    record("memcheck", f"{arch} {dtype} decode steps", summary[-1] if summary else "no summary")
    assert r.returncode == 0 and summary and " 0 errors" in summary[-1], r.stdout[-3000:]
