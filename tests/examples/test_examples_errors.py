"""Broken DSL files and bad arguments give one `fusionc:` line with file:line, exit 1."""
import textwrap

import pytest

import fusionc.cli

BAD_OP = """\
import fusionc as fc


def build(hidden=64):
    @fc.graph
    def mlp(x: fc.f16["B", hidden], w: fc.f16[32, 48]):
        h = fc.silu(x)
        return fc.linear(h, w)
    return mlp
"""


def run_cli(capsys, *argv):
    code = fusionc.cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


@pytest.mark.parametrize("text,line,fragment", [
    (BAD_OP, 8, "DSL error: 'linear': x f16[B, 64] has 64 input features"),
    ("import fusionc\n\ndef build(:\n", 3, "syntax error"),
    ("import fusionc\nx = 1 / 0\n", 2, "ZeroDivisionError"),
    ("import fusionc_nope\n", 1, "ModuleNotFoundError"),
    ("def build():\n    return 3\n", 1, "build() of"),
    ("x = 1\n", 1, "defines neither build() nor a module-level `module`"),
    ("module = 3\n", 1, "is a int, not a fusionc.ir.Module"),
])
def test_broken_files(capsys, tmp_path, text, line, fragment):
    path = write(tmp_path, "bad.py", text)
    code, out, err = run_cli(capsys, "ir", path)
    assert code == 1 and out == ""
    assert err.startswith(f"fusionc: {path}:{line}: ") and fragment in err, err
    assert "Traceback" not in err and err.count("\n") == 1


def test_bad_arguments(capsys, tmp_path):
    path = write(tmp_path, "ok.py", BAD_OP.replace("[32, 48]", "[32, 64]"))
    assert run_cli(capsys, "ir", path)[0] == 0
    cases = [(["ir", path, "-D", "size=3"], "has no size 'size' (valid: hidden)"),
             (["ir", path, "-D", "hidden"], "bad -D 'hidden'"),
             (["ir", path, "--graph", "x"], "no graph named 'x'"),
             (["tune", path, "--graph", "x", "--compile-only"], "no graph named 'x'"),
             (["ir", str(tmp_path / "missing.py")], "no such file"),
             (["ir", str(tmp_path / "missing.fir")], "cannot read")]
    for argv, fragment in cases:
        code, out, err = run_cli(capsys, *argv)
        assert code == 1 and fragment in err and err.startswith("fusionc: "), err


def test_bad_fir_text(capsys, tmp_path):
    path = write(tmp_path, "bad.fir", "graph @f(%x: f16[4]) {\n  %0 = silu(%y) : f16[4]\n"
                                      "  return %0\n}\n")
    code, _, err = run_cli(capsys, "ir", path)
    assert code == 1 and f"{path}:2:" in err and "undefined value %y" in err


def test_missing_files_and_sizes_of_the_wrong_type(capsys, tmp_path):
    for name in ("nope.py", "nope.fir"):
        code, _, err = run_cli(capsys, "ir", str(tmp_path / name))
        assert code == 1 and "cannot read" in err and ": no such file (valid: a DSL file" in err
    path = write(tmp_path, "sized.py", "def build(hidden: int = 64, eps: float = 1e-5):\n"
                                       "    return 3\n")
    code, _, err = run_cli(capsys, "ir", path, "-D", "hidden=abc")
    assert code == 1 and "size hidden = 'abc'" in err and "an integer" in err
    code, _, err = run_cli(capsys, "ir", path, "-D", "eps=abc")
    assert code == 1 and "size eps = 'abc'" in err and "a number" in err
