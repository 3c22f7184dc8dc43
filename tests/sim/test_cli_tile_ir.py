"""`fusionc ir` reads and prints tile IR, and shows the IR after a pass with a cost table."""
from __future__ import annotations

from fusionc.cli import main
from fusionc.ir import parse_module
from tests.passes.graphs import EXAMPLES
from tests.sim.programs import splitk_gemv


def test_ir_prints_tile_ir_from_a_file(tmp_path, capsys):
    f = tmp_path / "gemv.fir"
    f.write_text(splitk_gemv(4, 2, 16, 8, "f16"))
    assert main(["ir", str(f)]) == 0
    out = capsys.readouterr().out
    assert "cluster_reduce(%buf) {op = sum} : f32[B, 8]" in out  # masks = [] left out
    assert parse_module(out) == parse_module(f.read_text())


def test_ir_after_partition_units_shows_the_kernels_and_costs(capsys):
    assert main(["ir", str(EXAMPLES / "llama3_8b.py"), "--after", "partition-units",
                 "--graph", "attention"]) == 0
    out = capsys.readouterr().out
    assert "attn_units(" in out and "kernel @attention_k" in out
    assert "// kernel" in out and "est µs" in out and "attention_k" in out.split("kernel @")[0]
    parse_module(out)  # the cost table is in comments: the output still parses


def test_ir_rejects_unknown_pass(capsys):
    assert main(["ir", str(EXAMPLES / "llama2_7b.py"), "--after", "no-such-pass"]) == 1
    assert "no such pass" in capsys.readouterr().err
