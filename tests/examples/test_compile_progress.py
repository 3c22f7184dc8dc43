"""``fusionc compile`` says what it does: a line per graph as its simulator check starts, the
check's tolerance and output names, skipped checks, and graphs lowered to library calls."""
import pytest

import fusionc.cli

pytestmark = pytest.mark.slow   # fusionc compile of whole examples: lowering, NVRTC, simulator

SMALL = ["-D", "hidden=256", "-D", "heads=2", "-D", "intermediate=512", "-D", "max_seq=64"]


def run_cli(capsys, *argv):
    code = fusionc.cli.main(list(argv))
    return code, capsys.readouterr().out.splitlines()


def test_progress_and_check_line(capsys, tmp_path):
    code, lines = run_cli(capsys, "compile", "examples/llama2_7b.py", "-o", str(tmp_path), *SMALL)
    assert code == 0
    starts = [i for i, x in enumerate(lines) if x.startswith("checking @")]
    checks = [i for i, x in enumerate(lines) if x.startswith("simulator check @")]
    assert [lines[i].split()[1] for i in starts] == ["@attention", "@mlp"]
    assert len(checks) == 2 and all(s < c for s, c in zip(starts, checks))
    att = lines[checks[0]]
    assert "tolerance 1e-02" in att and "output 0 " in att and "k_cache.1 " in att
    assert att.endswith(" ok") and att.split(": ", 1)[1].startswith("output 0 ")


def test_lowered_input_says_skipped(capsys, tmp_path):
    run_cli(capsys, "compile", "examples/llama2_7b.py", "-o", str(tmp_path), "--graph", "mlp",
            *SMALL)
    (last,) = tmp_path.glob("mlp.*-smem-plan.fir")
    code, lines = run_cli(capsys, "compile", str(last), "-o", str(tmp_path / "again"))
    assert code == 0
    assert any(x.startswith("simulator check @mlp skipped: the input is already lowered")
               for x in lines), lines
    assert not any(x.startswith("checking @") for x in lines)


def test_library_calls_are_named(capsys, tmp_path):
    code, lines = run_cli(capsys, "compile", "examples/tp2_mlp.py", "-o", str(tmp_path),
                          "-D", "hidden=256", "-D", "intermediate=512", "--max-batch", "512")
    assert code == 0
    note = [x for x in lines if x.startswith("@mlp: ")]
    assert note and "library call" in note[0] and "no fused kernel" in note[0], lines


def test_stale_stages_removed(capsys, tmp_path):
    """A second compile into the same folder leaves only its own stage files."""
    (tmp_path / "mlp.9-old-pass.fir").write_text("stale")
    (tmp_path / "mlp_other.1-x.fir").write_text("another graph's")
    code, _ = run_cli(capsys, "compile", "examples/llama2_7b.py", "-o", str(tmp_path),
                      "--graph", "mlp", "--no-check", *SMALL)
    assert code == 0
    assert not (tmp_path / "mlp.9-old-pass.fir").exists()
    assert (tmp_path / "mlp_other.1-x.fir").exists() and (tmp_path / "mlp.0-input.fir").exists()
