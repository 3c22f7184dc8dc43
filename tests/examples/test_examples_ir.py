"""Every example builds, verifies and round-trips through the text form; `fusionc ir`."""
from pathlib import Path

import pytest

import fusionc.cli
from fusionc.dsl import load_file
from fusionc.ir import parse_module, print_module

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ALL = ["llama2_7b.py", "llama3_8b.py", "qwen3_qk_norm.py", "tp2_mlp.py", "deepseek_v2_lite.py"]
SMALL = {"llama2_7b.py": dict(hidden=64, heads=2, head_dim=32, intermediate=96, max_seq=16),
         "llama3_8b.py": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96),
         "qwen3_qk_norm.py": dict(hidden=48, heads=4, kv_heads=2, head_dim=16, intermediate=64),
         "tp2_mlp.py": dict(hidden=64, intermediate=96, tp=4),
         "deepseek_v2_lite.py": dict(hidden=64, heads=4, qk_nope=16, qk_rope=8, v_head=12,
                                     kv_lora=32, max_seq=16)}


def run_cli(capsys, *argv):
    code = fusionc.cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("small", [False, True])
def test_round_trip(name, small):
    m = load_file(EXAMPLES / name, **(SMALL[name] if small else {}))
    expected = {"tp2_mlp.py": ("mlp",), "deepseek_v2_lite.py": ("attention",)}.get(
        name, ("attention", "mlp"))
    assert m.names == expected
    text = print_module(m)
    assert parse_module(text) == m
    assert print_module(parse_module(text)) == text


def test_default_sizes_are_the_models():
    m = load_file(EXAMPLES / "llama3_8b.py")
    params = {p.name: str(p.type) for p in m["attention"].params}
    assert params["w_qkv"] == "bf16[6144, 4096]" and params["k_cache"].endswith(", 8, 128]")
    assert str(m["mlp"].params[3].type) == "bf16[4096, 14336]"
    q = load_file(EXAMPLES / "qwen3_qk_norm.py")["attention"]
    assert [op.name for op in q.body].count("rms_norm") == 3
    assert str(q.params[5].type) == "bf16[2560, 4096]"          # heads·head_dim ≠ hidden
    tp = load_file(EXAMPLES / "tp2_mlp.py")["mlp"]
    assert [op.name for op in tp.body][-2:] == ["all_reduce", "add"]
    mla = load_file(EXAMPLES / "deepseek_v2_lite.py")["attention"]
    types = {p.name: str(p.type) for p in mla.params}
    assert types["cache"] == "bf16[B, 4096, 576]" and types["w_uk_t"] == "bf16[16, 512, 128]"


@pytest.mark.parametrize("name", ALL)
def test_cli_prints_and_reprints(capsys, tmp_path, name):
    code, text, err = run_cli(capsys, "ir", str(EXAMPLES / name))
    assert code == 0 and err == "" and text.startswith("graph @")
    fir = tmp_path / "m.fir"
    fir.write_text(text)
    code, again, err = run_cli(capsys, "ir", str(fir))
    assert code == 0 and again == text


def test_cli_sizes_and_graph(capsys):
    code, text, _ = run_cli(capsys, "ir", str(EXAMPLES / "llama2_7b.py"), "-D", "hidden=64",
                            "-D", "heads=2", "-D", "head_dim=32", "-D", "dtype='bf16'",
                            "--graph", "attention")
    assert code == 0 and text.startswith("graph @attention(%x: bf16[B, 64],")
    assert "graph @mlp" not in text


@pytest.mark.parametrize("argv", [[], ["ir"]])
def test_help(capsys, argv):
    with pytest.raises(SystemExit) as e:
        fusionc.cli.main(argv + ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: fusionc" in out
    if argv:
        assert "build(**sizes)" in out and "-D NAME=VALUE" in out


def test_every_subcommand_has_help(capsys):
    for name in fusionc.cli.COMMANDS:
        with pytest.raises(SystemExit) as e:
            fusionc.cli.main([name, "--help"])
        assert e.value.code == 0
        assert f"usage: fusionc {name}" in capsys.readouterr().out


def test_module_level_convention_and_fir_without_sizes(capsys, tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import fusionc as fc\n\n@fc.graph\ndef g(x: fc.f32[4]):\n"
                   "    return fc.silu(x)\n\nmodule = g\n")
    code, text, _ = run_cli(capsys, "ir", str(src))
    assert code == 0 and text.startswith("graph @g(%x: f32[4])")
    fir = tmp_path / "m.fir"
    fir.write_text(text)
    code, _, err = run_cli(capsys, "ir", str(fir), "-D", "hidden=4")
    assert code == 1 and "-D sizes apply only to a .py DSL file" in err
    code, _, err = run_cli(capsys, "ir", str(src), "-D", "hidden=4")
    assert code == 1 and "no build() function" in err
