"""Golden snapshots of generated CUDA for two fixed small kernels, so that every template change
shows up in review. Regenerate after an intended change with

    FUSIONC_UPDATE_GOLDEN=1 python -m pytest tests/codegen/test_codegen_golden.py
"""
from __future__ import annotations

import os
import pathlib

import pytest

from fusionc.codegen import generate_cuda
from fusionc.ir import parse_module
from tests.sim.programs import collective_kernel, splitk_gemv

GOLDEN = pathlib.Path(__file__).with_name("golden")
CASES = {
    "cluster_reduce_sum_c4_f32": collective_kernel("sum", 4, 2, (4, 33), "f32"),
    "splitk_gemv_c4_f16": splitk_gemv(4, 2, 64, 16, "f16"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    source = generate_cuda(parse_module(CASES[name]).graphs[0]).source
    path = GOLDEN / f"{name}.cu"
    if os.environ.get("FUSIONC_UPDATE_GOLDEN"):
        path.write_text(source)
    assert path.exists(), f"missing {path}: run with FUSIONC_UPDATE_GOLDEN=1"
    expected = path.read_text()
    if source != expected:
        import difflib
        diff = "".join(difflib.unified_diff(expected.splitlines(True), source.splitlines(True),
                                            f"golden/{name}.cu", "generated", n=2))
        pytest.fail(f"generated CUDA differs from golden/{name}.cu (regenerate with "
                    f"FUSIONC_UPDATE_GOLDEN=1 if intended):\n{diff[:4000]}")
