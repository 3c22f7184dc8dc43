"""Issue 26: the command line on bad input gives one ``fusionc:`` line and exit 1, or a clear
note, never a traceback or a silent success."""
import pathlib

import pytest

import fusionc.cli
import fusionc.commands.check as compile_cmd

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
    assert "--no-check" in out and (tmp_path / "mlp_k1.cubin").exists()


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


# ---- item 3: output files that cannot be written

def test_a_folder_where_a_file_goes(capsys, tmp_path):
    (tmp_path / "mlp.0-input.fir").mkdir()
    code, _, err = run_cli(capsys, "compile", LLAMA2, *SMALL, "--graph", "mlp", "-o", tmp_path)
    assert code == 1 and err.startswith("fusionc: ") and "cannot write" in err, err
    assert "mlp.0-input.fir" in err and "remove the folder" in err


@pytest.mark.skipif(hasattr(__import__("os"), "geteuid") and __import__("os").geteuid() == 0,
                    reason="root writes into read-only folders")
def test_a_read_only_output_folder(capsys, tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        code, _, err = run_cli(capsys, "compile", LLAMA2, *SMALL, "--graph", "mlp", "-o", out)
    finally:
        out.chmod(0o700)
    assert code == 1 and "cannot write" in err and "writable output folder" in err, err


def test_a_read_only_file_system(capsys, tmp_path, monkeypatch):
    def refuse(self, *_a, **_k):
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(pathlib.Path, "write_text", refuse)
    code, _, err = run_cli(capsys, "compile", LLAMA2, *SMALL, "--graph", "mlp", "-o", tmp_path)
    assert code == 1 and "cannot write" in err and "Permission denied" in err, err


def test_a_graph_name_too_long_for_a_file(capsys, tmp_path):
    src = tmp_path / "long.py"
    name = "m" * 300
    src.write_text(f"import sys\nsys.path.insert(0, {str(EXAMPLES)!r})\nimport fusionc as fc\n"
                   "from llama2_7b import build as llama\n"
                   "mlp = llama(hidden=256, heads=2, intermediate=512)['mlp']\n"
                   f"module = fc.module(mlp.replace(name='{name}'))\n")
    code, _, err = run_cli(capsys, "compile", src, "-o", tmp_path / "out")
    assert code == 1 and err.startswith("fusionc: ") and "cannot write" in err, err
    assert "a shorter graph name" in err


# ---- item 13: a lowered .fir with two host graphs

def _lowered_fir(capsys, tmp_path):
    """One .fir holding both graphs of the small Llama 2 layer, lowered (kernels included)."""
    from fusionc.ir import Module, print_module
    from fusionc.passes import run_pipeline
    from tests.passes.graphs import example
    m = example("llama2_7b", hidden=256, heads=2, intermediate=512, max_seq=64)
    from fusionc.runtime.pipelines import v2_default_pipeline
    parts = [run_pipeline(Module((g,)), v2_default_pipeline(g, 2)) for g in m.graphs]
    path = tmp_path / "lowered.fir"
    path.write_text(print_module(Module(tuple(g for p in parts for g in p.graphs))))
    return path


def test_lowered_fir_with_two_graphs(capsys, tmp_path, tmp_cache):
    path = _lowered_fir(capsys, tmp_path)
    code, out, _ = run_cli(capsys, "compile", path, "-o", tmp_path / "all")
    reports = [line.split(":")[0] for line in out.splitlines() if "threads" in line]
    assert code == 0 and len(reports) == len(set(reports)) >= 2, out
    code, out, _ = run_cli(capsys, "compile", path, "--graph", "mlp", "-o", tmp_path / "one")
    only = [line.split(":")[0] for line in out.splitlines() if "threads" in line]
    assert code == 0 and only and all("mlp" in k for k in only), out
    for flags in (["--max-batch", "8"], ["--passes", "fold-views"], ["--lowering", "v2"]):
        code, _, err = run_cli(capsys, "compile", path, *flags, "-o", tmp_path / "x")
        assert code == 1 and f"{flags[0]} given for" in err and "already lowered" in err, err


# ---- items 4, 12: fusionc tune on IR text, and when no candidate compiles

def test_tune_compile_only_on_ir_text(capsys, tmp_path, tmp_cache):
    graph_ir = tmp_path / "mlp.fir"
    code, out, _ = run_cli(capsys, "ir", LLAMA2, *SMALL, "--graph", "mlp")
    graph_ir.write_text(out)
    code, out, err = run_cli(capsys, "tune", graph_ir, "--compile-only")   # v2: the MLP
    assert code == 0 and "@mlp: 4 candidates compiled" in out, err
    code, _, err = run_cli(capsys, "tune", _lowered_fir(capsys, tmp_path), "--compile-only")
    assert code == 1 and "already lowered" in err, err
    other = tmp_path / "notes.txt"
    other.write_text("x = 1\n")
    code, _, err = run_cli(capsys, "tune", other, "--compile-only")
    assert code == 1 and err.startswith("fusionc: "), err


def test_tune_when_no_candidate_compiles(capsys, tmp_cache):
    code, out, err = run_cli(capsys, "tune", LLAMA2, *SMALL, "--graph", "attention",
                             "--batch", "100000", "--compile-only")
    assert code == 1 and "0 candidates" not in out, out
    assert "no candidate of the autotuning search compiles at batch 100000" in err, err


# ---- item 10: the check's positions come from how a parameter is used, not its name

def test_positions_parameter_of_any_name(capsys, tmp_path, tmp_cache):
    from fusionc.commands.check import positions_params
    from fusionc.ir import parse_module, print_module
    from tests.passes.graphs import example
    m = example("llama2_7b", hidden=256, heads=2, intermediate=512, max_seq=16)
    text = print_module(m).replace("%positions", "%where").replace("%seq_lens", "%pos_lens")
    assert positions_params(parse_module(text)["attention"]) == {"where"}
    path = tmp_path / "where.fir"
    path.write_text(text)
    code, out, err = run_cli(capsys, "compile", path, "--graph", "attention", "-o", tmp_path)
    assert code == 0 and "simulator check @attention" in out and " ok" in out, err


# ---- item 11: the cost table's batch and KV length are positive

@pytest.mark.parametrize("flag, value", [("--batch", "-1"), ("--kv-len", "-5"),
                                         ("--batch", "0")])
def test_cost_table_sizes_must_be_positive(capsys, flag, value):
    with pytest.raises(SystemExit) as info:
        fusionc.cli.main(["ir", LLAMA2, *SMALL, "--after", "partition-units", flag, value])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"argument {flag}" in err and "is not positive" in err, err


# ---- item 15: generated kernel names, and -D sizes

def test_graph_named_like_a_generated_kernel(capsys, tmp_path):
    src = tmp_path / "k0.py"
    src.write_text("import fusionc as fc\nfrom fusionc.models.blocks import mlp_block\n\n\n"
                   "def build():\n"
                   "    a = mlp_block(hidden=256, intermediate=512, eps=1e-5, dtype='f16')['mlp']\n"
                   "    return fc.module(a, a.replace(name='mlp_k0'))\n")
    code, out, err = run_cli(capsys, "ir", src, "--lowering", "v2", "--after",
                             "partition-units")
    assert code == 0, err
    names = [line.split()[1].split("(")[0] for line in out.splitlines()
             if line.startswith(("kernel", "graph"))]
    assert len(names) == len(set(names)) >= 4 and "@mlp_k0" in names, names


@pytest.mark.parametrize("size, fragment", [
    ("heads=0", "size heads = 0"), ("max_seq=0", "size max_seq = 0"),
    ("head_dim=0", "size head_dim = 0"), ("hidden=-4", "size hidden = -4"),
    ("hidden=True", "size hidden = True"), ("eps=True", "size eps = True"),
    ("hidden=99999999999999999999", "up to 2147483647")])
def test_bad_sizes_are_named(capsys, size, fragment):
    code, out, err = run_cli(capsys, "ir", LLAMA2, "-D", size)
    assert code == 1 and out == "" and fragment in err and "valid:" in err, err


def test_a_size_given_twice_is_named(capsys):
    code, out, err = run_cli(capsys, "ir", LLAMA2, "-D", "hidden=256", "-D", "hidden=300")
    assert code == 1 and out == "" and "-D hidden given twice" in err, err


# ---- lowering v2 on the command line (issue 21)

GRAPHS_V2 = [str(EXAMPLES / "graphs_v2.py"), "-D", "hidden=256", "-D", "inter=200"]


def test_ir_runs_each_graph_on_its_own_default_pipeline(capsys):
    """At 17 rows the f16 graphs fuse but mlp_shard (rows TMA cannot copy: the FMA bucket is
    16) takes the library path, which has no smem-plan: it is shown as traced, and named."""
    code, out, err = run_cli(capsys, "ir", *GRAPHS_V2, "--lowering", "v2", "--max-batch", 17,
                             "--after", "smem-plan")
    assert code == 0 and "ring_alloc" in out and "kernel @mlp_k" in out, err
    assert "@mlp_shard shown as traced: its pipeline has no smem-plan" in err, err
    code, out, _ = run_cli(capsys, "ir", *GRAPHS_V2, "--lowering", "v2", "--max-batch", 17,
                           "--after", "smem-plan", "--graph", "mlp")
    assert code == 0 and "ring_alloc" in out


def test_ir_default_lowering_is_compiles(capsys):
    """Without --lowering, `fusionc ir --after` shows what fusionc.compile runs: v2 here."""
    code, out, err = run_cli(capsys, "ir", *GRAPHS_V2, "--after", "partition-units",
                             "--graph", "swiglu")
    assert code == 0 and "kernel @swiglu_k" in out, err
    code, _, err = run_cli(capsys, "ir", *GRAPHS_V2, "--after", "partition-cluster",
                           "--graph", "swiglu")   # a pass of the removed lowering v1
    assert code == 1 and "no such pass" in err and "partition-units" in err, err


def test_ir_after_a_pass_on_a_lowered_module_names_it(capsys, tmp_path):
    """A lowered .fir runs as one module (its kernels with the graph that launches them):
    the pass that would lower it again says so."""
    code, out, err = run_cli(capsys, "ir", *GRAPHS_V2, "--after", "smem-plan", "--graph",
                             "swiglu")
    assert code == 0, err
    f = tmp_path / "swiglu.fir"
    f.write_text(out)
    code, _, err = run_cli(capsys, "ir", str(f), "--after", "smem-plan")
    assert code == 1 and "already lowered" in err and err.count("\n") == 1, err


def test_compile_with_passes_runs_only_those(capsys, tmp_path, tmp_cache):
    """--passes replaces the default pipeline (no default is computed)."""
    code, out, err = run_cli(capsys, "compile", *GRAPHS_V2, "--graph", "swiglu", "-o", tmp_path,
                             "--passes", "partition-units{max_batch=4},stream-plan,"
                             "insert-barriers,smem-plan")
    assert code == 0, err


@pytest.mark.parametrize("command, flags", [
    ("compile", ["--lowering", "v1"]), ("compile", ["--cluster", "4"]),
    ("compile", ["--scheme", "splitk"]), ("run", ["--lowering", "v1"]),
    ("run", ["--cluster", "2"]), ("ir", ["--lowering", "v1", "--after", "partition-units"]),
    ("tune", ["--lowering", "v1"])])
def test_the_removed_lowering_v1_and_its_options_are_usage_errors(capsys, tmp_path, command,
                                                                  flags):
    """Lowering v1 (cluster kernels) was removed: its flags are argparse usage errors naming
    the flag, before anything is compiled."""
    out = ["-o", str(tmp_path)] if command == "compile" else []
    with pytest.raises(SystemExit) as info:
        fusionc.cli.main([command, GRAPHS_V2[0], *flags, *out])
    err = capsys.readouterr().err
    assert info.value.code == 2 and flags[0] in err, err


def test_ir_after_a_fused_pass_names_the_ops_no_kernel_takes(capsys, tmp_path):
    """A graph of ops no fused kernel takes (a lone embedding) blames them, not the bucket."""
    src = tmp_path / "ends.py"
    src.write_text("import fusionc as fc\n\n\ndef build():\n    @fc.graph\n"
                   "    def embed(table: fc.f16[100, 64], tokens: fc.i32['B']):\n"
                   "        return fc.embedding(table, tokens, name='x')\n"
                   "    return fc.module(embed)\n")
    code, _, err = run_cli(capsys, "ir", str(src), "--lowering", "v2", "--after", "smem-plan")
    assert code == 1 and "no fused kernel takes embedding at" in err, err
    assert "fused bucket" not in err, err


DEEPSEEK = str(EXAMPLES / "deepseek_v2_lite.py")
MLA_SMALL = ["-D", "hidden=64", "-D", "heads=4", "-D", "qk_nope=16", "-D", "qk_rope=16",
             "-D", "v_head=16", "-D", "kv_lora=64", "-D", "max_seq=64"]


def test_mla_compiles_on_lowering_v2_by_default(capsys, tmp_path, tmp_cache):
    code, out, err = run_cli(capsys, "compile", DEEPSEEK, *MLA_SMALL, "--max-batch", 2,
                             "-o", tmp_path)
    assert code == 0 and "cache.1 0.0e+00 ok" in out, (out, err)
    stages = sorted(p.name for p in tmp_path.glob("attention.*.fir"))
    assert "attention.1-fold-views.fir" in stages, stages
    assert any("mla_units(" in (tmp_path / s).read_text() for s in stages), stages


def test_a_kernel_past_the_shared_memory_limit_is_named(capsys, tmp_path):
    """A size whose fused kernel needs more shared memory than a CTA has is refused at compile
    time, naming the kernel (before, it compiled and would have failed at launch)."""
    code, _, err = run_cli(capsys, "compile", LLAMA2, "-D", "hidden=1048576", "--graph", "mlp",
                           "--no-check", "-o", tmp_path)
    assert code == 1 and err.count("\n") == 1, err
    assert "compile error: 'mlp_k1': kernel fusionc_mlp_k1 needs" in err and \
        "at most 232448 B" in err, err


@pytest.mark.parametrize("command, flag", [("ir", "--after"), ("ir", "--passes"),
                                           ("compile", "--passes")])
def test_empty_pass_options_are_named(capsys, tmp_path, command, flag):
    out = ["-o", tmp_path] if command == "compile" else []
    code, _, err = run_cli(capsys, command, LLAMA2, *SMALL, flag, " ", *out)
    assert code == 1 and f"input error: {flag} ' '" in err and err.count("\n") == 1, err


def test_a_size_without_a_default_asks_for_it(capsys, tmp_path):
    src = tmp_path / "nodef.py"
    src.write_text("from fusionc.models.blocks import mlp_block\n\n\n"
                   "def build(hidden, inter: int = 512):\n"
                   "    return mlp_block(hidden=hidden, intermediate=inter, eps=1e-5, "
                   "dtype='f16')\n")
    code, _, err = run_cli(capsys, "ir", src)
    assert code == 1 and "needs size hidden" in err and "-D hidden=VALUE" in err, err
    code, out, _ = run_cli(capsys, "ir", src, "-D", "hidden=256")
    assert code == 0 and "graph @mlp" in out


def test_ir_cost_table_batch_past_the_bucket_is_named(capsys):
    """``--batch`` past the kernels' batch bucket (``--max-batch``) would cost kernels that
    refuse that batch: a named error with what is valid, not a table."""
    code, out, err = run_cli(capsys, "ir", LLAMA2, *SMALL, "--graph", "mlp", "--after",
                             "smem-plan", "--batch", "16", "--max-batch", "8")
    assert code == 1 and "--batch 16 is past the batch bucket of @mlp_k1 (8)" in err
    assert "--batch <= 8, or a larger --max-batch" in err and "cost on" not in out
    code, out, _ = run_cli(capsys, "ir", LLAMA2, *SMALL, "--graph", "mlp", "--after",
                           "smem-plan", "--batch", "16", "--max-batch", "16")
    assert code == 0 and "at batch 16" in out


def test_ir_options_that_need_after_say_so(capsys):
    code, out, err = run_cli(capsys, "ir", LLAMA2, *SMALL, "--graph", "mlp", "--max-batch",
                             "4", "--lowering", "v2")
    assert code == 0 and "graph @mlp" in out
    assert "note: --lowering, --max-batch only act with --after or --passes" in err
    code, _, err = run_cli(capsys, "ir", LLAMA2, *SMALL, "--graph", "mlp")
    assert code == 0 and "note" not in err
