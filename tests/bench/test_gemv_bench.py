"""benchmarks/gemv.py on the CPU: shapes, points and shards, floors and targets, rows, CSV and
the table, the lowering= keyword, a dry run and the timed run's bookkeeping (torch stubbed)."""
import csv
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import common, gemv  # noqa: E402

REQUIRED = [(4096, 4096), (6144, 4096), (12288, 4096), (22016, 4096), (28672, 4096),
            (4096, 11008), (4096, 14336), (8192, 8192), (2048, 8192)]


def args(*argv):
    return gemv.parse_args(list(argv))


def test_shapes():
    shapes = [(n, k) for n, k, _ in gemv.SHAPES]
    assert shapes[:9] == REQUIRED and len(shapes) == 12 == len(set(shapes))
    assert all(m and m != "custom" for _, _, m in gemv.SHAPES)
    assert set(gemv.QUICK_SHAPES) <= set(shapes)
    assert gemv.model_of(4608, 3584) == "Qwen2.5-7B fused qkv"
    assert gemv.model_of(1, 1) == "custom"


def test_points_order_and_counts():
    pts = gemv.points()
    assert len(pts) == 12 * 2 * 9
    assert pts[0] == dict(n=4096, k=4096, dtype="fp16", batch=1)
    assert pts[9] == dict(n=4096, k=4096, dtype="bf16", batch=1)
    assert pts[18]["n"] == 6144 and pts[-1] == dict(n=3072, k=8192, dtype="bf16", batch=256)
    quick = gemv.points(quick=True)
    assert len(quick) == 12 and {p["dtype"] for p in quick} == {"fp16"}
    assert gemv.points(quick=True, dtypes=("bf16",))[0]["dtype"] == "bf16"
    some = gemv.points(shapes=[(8192, 8192), (100, 64)], batches=(32, 256))
    assert [(p["n"], p["batch"]) for p in some[:3]] == [(8192, 32), (8192, 256), (8192, 32)]
    assert len(some) == 8


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_shards_partition_the_points(n):
    full = gemv.points()
    shards = [gemv.points(shard=(i, n)) for i in range(n)]
    assert sorted(len(s) for s in shards)[-1] - sorted(len(s) for s in shards)[0] <= 1
    together = [p for s in shards for p in s]
    assert len(together) == len(full)
    assert sorted(map(str, together)) == sorted(map(str, full))
    assert shards[0] == full[::n] == gemv.points(shard=(0, n))  # deterministic


def test_argument_types():
    a = args("--shard", "1/3", "--shapes", "4096x4096,28672X4096", "--batches", "1,32,256",
             "--dtypes", "bf16,f16", "--bias", "--lowering", "v1")
    assert a.shard == (1, 3) and a.shapes == [(4096, 4096), (28672, 4096)]
    assert a.batches == (1, 32, 256) and a.dtypes == ("bf16", "fp16") and a.bias
    assert a.lowering == "v1"
    d = args()
    assert d.lowering == "v2" and d.shard is None and not d.no_torch and d.reps == 30
    assert args("--dry-run").no_torch and args("--no-torch").no_torch
    assert gemv.shape_list("4608×3584") == [(4608, 3584)]
    for bad in (["--shard", "3/3"], ["--shard", "-1/2"], ["--shard", "1"], ["--shard", "0/0"],
                ["--shapes", "4096"], ["--shapes", "0x5"], ["--dtypes", "fp8"],
                ["--batches", "0"], ["--lowering", "v3"]):
        with pytest.raises(SystemExit):
            args(*bad)


def test_floor_and_target():
    bw = 4e12
    nbytes = (4096 * 4096 + 4096 + 4096) * 2
    assert gemv.floor_bytes(4096, 4096, 1) == nbytes
    assert gemv.floor_bytes(4096, 4096, 1, bias=True) == nbytes + 4096 * 2
    assert gemv.floor_flops(4096, 4096, 1) == 2 * 4096 * 4096
    assert gemv.floor_us(4096, 4096, 1, bw) == pytest.approx(nbytes / bw * 1e6)  # memory bound
    flops = 2 * 256 * 4096 * 4096   # batch 256: FLOP bound at 790 TFLOP/s
    assert gemv.floor_us(4096, 4096, 256, bw) == pytest.approx(flops / 790e12 * 1e6)
    assert gemv.floor_us(4096, 4096, 256, bw) > gemv.floor_bytes(4096, 4096, 256) / bw * 1e6
    assert gemv.target_us(9.5) == pytest.approx(12.0)
    assert gemv.target_us(9.0, batch=32) == pytest.approx(12.0)   # floor / 0.9 + 2 from 32 rows


def test_weight_sets_exceed_three_l2():
    for n, k, _ in gemv.SHAPES:
        s = gemv.weight_sets(n, k)
        assert s >= 2 and s * n * k * 2 > 3 * common.L2_BYTES
        assert (s - 2) * n * k * 2 < 3 * common.L2_BYTES   # ceil(...) + 1, not more
    assert gemv.weight_sets(4096, 4096) == 7 and gemv.weight_sets(28672, 4096) == 2


def test_summarize():
    p = dict(n=4096, k=4096, dtype="fp16", batch=1)
    bw = 4e12
    fl = gemv.floor_us(4096, 4096, 1, bw)
    r = gemv.summarize(p, bw, fusionc_us=fl * 1.25, linear_us=fl * 2, err=3e-4)
    assert r["pct_of_floor"] == pytest.approx(80.0) and r["vs_linear"] == pytest.approx(1.6)
    assert r["target_us"] == pytest.approx(fl / 0.95 + 2) and r["met"] == "ok"
    assert r["shape"] == "4096x4096" and r["model"] == "Llama-2/3-7/8B q/o proj"
    assert gemv.summarize(p, bw, fusionc_us=fl / 0.95 + 2.1, err=3e-4)["met"] == "MISS"
    assert gemv.summarize(p, bw, fusionc_us=fl, err=0.5)["met"] == "FAIL"
    assert gemv.summarize(p, bw, fusionc_us=fl, err=float("nan"))["met"] == "FAIL"
    empty = gemv.summarize(p, bw, linear_us=20.0)
    assert empty["met"] is None and empty["pct_of_floor"] is None and empty["vs_linear"] is None


def test_cells_csv_and_table():
    p = dict(n=4096, k=14336, dtype="bf16", batch=16)
    r = gemv.summarize(p, 4.2e12, bias=True, lowering="v2", path="kernel", fusionc_us=40.0,
                       linear_us=50.0, err=0.02, linear_err=1e-3, note="x")
    row = dict(zip(gemv.CSV_COLS, gemv.csv_row(r)))
    assert len(gemv.csv_row(r)) == len(gemv.CSV_COLS)
    assert row["fusionc_us"] == "40.000" and row["vs_linear"] == "1.250"
    assert row["err"] == "2.0e-02" and row["met"] == "FAIL" and row["bias"] == "1"
    assert row["bw_TBps"] == "4.200" and row["sets"] == str(gemv.weight_sets(4096, 14336, True))
    assert float(row["floor_us"]) == pytest.approx(r["floor_us"], abs=1e-3)
    text = gemv.table([r])
    head, rule, line = text.splitlines()
    assert head == "| " + " | ".join(gemv.TABLE_COLS) + " |"
    cells = dict(zip(gemv.TABLE_COLS, [c.strip() for c in line.strip("|").split("|")]))
    assert cells["vs_linear"] == "1.25x" and cells["err"] == "2.0e-02 FAIL"
    assert cells["fusionc_us"] == "40.0" and cells["met"] == "FAIL" and cells["path"] == "kernel"
    blank = gemv.csv_row(gemv.summarize(p, 4e12))
    assert blank[gemv.CSV_COLS.index("fusionc_us")] == ""


def test_lowering_keyword():
    def old(program, *, max_batch=8):
        pass

    def new(program, *, max_batch=8, lowering="v2"):
        pass

    def required(program, *, lowering):
        pass

    assert gemv.installed_lowering(old) == "v1"
    assert gemv.installed_lowering(new) == "v2" and gemv.installed_lowering(required) is None
    assert gemv.lowering_kwargs("v2", "v2") == {}
    assert gemv.lowering_kwargs("v1", "v2") == {"lowering": "v1"}
    assert gemv.lowering_kwargs("v2", "v1") == {"lowering": "v2"}
    assert gemv.lowering_kwargs("v1", None) == {"lowering": "v1"}
    import fusionc
    assert gemv.installed_lowering() == gemv.installed_lowering(fusionc.compile)


def test_compile_point_without_lowering_keyword(monkeypatch):
    import fusionc
    seen = []

    def old(program, *, max_batch=8):
        seen.append(max_batch)
        raise fusionc.errors.CompileError("no kernel for this")

    monkeypatch.setattr(fusionc, "compile", old)
    p = dict(n=256, k=128, dtype="bf16", batch=4)
    with pytest.raises(gemv.LoweringUnsupported, match="--lowering v1"):
        gemv.compile_point(p, args(), gemv.installed_lowering(old))
    fn, path, note = gemv.compile_point(p, args("--lowering", "v1"), "v1")
    assert fn is None and path == "error" and note.startswith("CompileError") and seen == [4]


@pytest.mark.parametrize("bias", [False, True])
def test_graph(bias):
    mod = gemv.gemv_module(6144, 4096, "bf16", bias)
    g = mod.graphs[0]
    assert [p.name for p in g.params] == (["x", "w", "b"] if bias else ["x", "w"])
    assert g.params[0].type.shape == ("B", 4096) and g.params[1].type.shape == (6144, 4096)
    assert g.params[0].type.dtype.value == "bf16" and g.outputs[0].type.shape == ("B", 6144)
    assert [op.name for op in g.body] == ["linear"]


def test_compile_point_installed_default(tmp_path, monkeypatch):
    """The installed fusionc at its own default lowering compiles a real point."""
    monkeypatch.setenv("FUSIONC_CACHE_DIR", str(tmp_path))
    a = args()
    installed = gemv.installed_lowering()
    a.lowering = installed or "v2"
    fn, path, note = gemv.compile_point(dict(n=4096, k=4096, dtype="fp16", batch=2), a,
                                        installed)
    assert fn is not None and path in ("kernel", "cublas"), note
    assert fn.host.outputs[0].name == "y" and fn.max_batch == 2


def test_dry_run_writes_csv(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    rows = gemv.run(args("--no-torch", "--no-fusionc", "--shard", "2/3"))
    assert len(rows) == 72
    out = tmp_path / "gemv-shard2of3.csv"
    with open(out) as f:
        got = list(csv.DictReader(f))
    assert len(got) == 72 and list(got[0]) == gemv.CSV_COLS
    assert got[0]["shape"] == "4096x4096" and got[0]["batch"] == "4"
    assert float(got[0]["bw_TBps"]) == pytest.approx(4.1)
    text = capsys.readouterr().out
    assert text.rstrip().splitlines()[-74].startswith("| shape | dtype | batch |")
    path = tmp_path / "x" / "g.csv"
    assert len(gemv.run(args("--dry-run", "--no-fusionc", "--quick", "--csv", str(path)))) == 12
    assert len(path.read_text().splitlines()) == 13


def test_timed_run_bookkeeping(tmp_path, monkeypatch, capsys):
    """The GPU branch of run() with torch, the measurement and the compiler stubbed."""
    made, measured = [], []
    cuda = types.SimpleNamespace(get_device_name=lambda: "stub GPU", empty_cache=lambda: None)
    monkeypatch.setattr(gemv, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(common, "copy_bandwidth", lambda: 4.0e12)
    monkeypatch.setattr(gemv, "make_weights", lambda p, bias: made.append((p, bias)) or ["w"])

    def measure(p, fn, weights, reps):
        measured.append((p["batch"], fn, weights, reps))
        if p["batch"] == 16:
            return dict(linear_us=30.0, note="InputError: boom")
        fl = gemv.floor_us(p["n"], p["k"], p["batch"], 4.0e12, True)
        return dict(fusionc_us=fl, linear_us=2 * fl, err=1e-3, linear_err=1e-3)

    monkeypatch.setattr(gemv, "measure", measure)
    monkeypatch.setattr(gemv, "compile_point", lambda p, a, inst: ("fn", "kernel", ""))
    monkeypatch.setattr(gemv, "installed_lowering", lambda: "v2")
    a = args("--shapes", "4096x4096,2048x8192", "--dtypes", "fp16", "--batches", "1,16",
             "--bias", "--reps", "5", "--csv", str(tmp_path / "g.csv"))
    rows = gemv.run(a)
    assert [r["met"] for r in rows] == ["ok", None, "ok", None]
    assert [r["vs_linear"] for r in rows][::2] == [2.0, 2.0]
    assert rows[1]["note"] == "InputError: boom" and rows[1]["linear_us"] == 30.0
    assert len(made) == 2 and all(b for _, b in made)   # weights once per shape, with bias
    assert [m[0] for m in measured] == [1, 16, 1, 16] and {m[3] for m in measured} == {5}
    assert "copy bandwidth 4.00 TB/s on stub GPU" in capsys.readouterr().out
    with open(tmp_path / "g.csv") as f:
        assert [r["met"] for r in csv.DictReader(f)] == ["ok", "", "ok", ""]


def test_timed_run_needs_torch(monkeypatch):
    monkeypatch.setattr(gemv, "torch", None)
    with pytest.raises(SystemExit, match="torch is not installed"):
        gemv.run(args("--no-fusionc", "--csv", "/dev/null"))
