"""Issue 26: the command line on bad input gives one ``fusionc:`` line and exit 1, or a clear
note, never a traceback or a silent success."""
import pathlib

import pytest

import fusionc.cli
import fusionc.commands.compile as compile_cmd

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
LLAMA2 = str(EXAMPLES / "llama2_7b.py")
SMALL = ["-D", "hidden=256", "-D", "heads=2", "-D", "intermediate=512"]


def run_cli(capsys, *argv):
    code = fusionc.cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSIONC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ---- item 2: the simulator check estimates its memory before it starts

def test_check_of_a_huge_mlp_is_skipped_with_a_note(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(compile_cmd, "memory_budget", lambda: 8 << 30)
    code, out, _ = run_cli(capsys, "compile", LLAMA2, "-D", "hidden=16384",
                           "-D", "intermediate=53248", "--graph", "mlp", "-o", tmp_path)
    assert code == 0 and "simulator check @mlp skipped: it needs about" in out, out
    assert "--no-check" in out and (tmp_path / "mlp_k0.cubin").exists()


def test_check_at_one_row_when_the_batch_does_not_fit(monkeypatch):
    from tests.passes.graphs import example
    g = example("llama2_7b", hidden=256, heads=2, intermediate=512, max_seq=8192)["attention"]
    two, one = compile_cmd.check_memory(g, 2), compile_cmd.check_memory(g, 1)
    assert one < two
    monkeypatch.setattr(compile_cmd, "memory_budget", lambda: (one + two) // 2)
    assert compile_cmd.check_plan(g, 2) == (1, None)
    monkeypatch.setattr(compile_cmd, "memory_budget", lambda: one - 1)
    batch, note = compile_cmd.check_plan(g, 2)
    assert batch == 0 and "skipped" in note
