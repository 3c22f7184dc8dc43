"""Issue 26: bad DSL or IR input gives a named fusionc error at the user's line or IR
line:column, never a traceback or a kernel that returns NaN."""
import sys

import pytest

import fusionc as fc
from fusionc import f16, i32
from fusionc.errors import DSLError, VerifyError
from fusionc.ir import parse_module


def _here() -> int:
    return sys._getframe(1).f_lineno


# ---- item 1: float attributes are checked against fp32, the type the GPU computes them in

@pytest.mark.parametrize("scale", [1e300, 1e39])
def test_attention_scale_that_overflows_fp32(scale):
    with pytest.raises(DSLError) as info:
        line = _here() + 4

        @fc.graph
        def bad(q: f16["B", 2, 8], k: f16["B", 16, 2, 8], v: f16["B", 16, 2, 8], n: i32["B"]):
            return fc.decode_attention(q, k, v, n, scale=scale)
    msg = str(info.value)
    assert f"{__file__}:{line}:" in msg and "'decode_attention'" in msg and "fp32" in msg, msg


def test_float_attributes_in_ir_text_are_checked_against_fp32(tmp_path, capsys):
    import fusionc.cli
    text = ("graph @f(%x: f16[B, 8], %w: f16[8]) {\n"
            "  %0 = rms_norm(%x, %w) {eps = 1e-60} : f16[B, 8]\n  return %0\n}\n")
    m = parse_module(text)    # IR text keeps doubles exactly (round trip)
    with pytest.raises(VerifyError, match=r"2:\d+: .*'rms_norm'.*0 in fp32"):
        fc.compile(m)
    path = tmp_path / "tiny.fir"
    path.write_text(text)
    code = fusionc.cli.main(["compile", str(path), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1 and f"{path}:2:" in err and "fp32" in err and "Traceback" not in err, err
    scaled = ("graph @f(%x: f16[B, 2, 8], %p: i32[B]) {\n  %0 = rope(%x, %p) {theta = 10000.0, "
              "style = neox, rotary_dim = 8, scaling = [8.0, 1.0, 4.0, 1e40]} : f16[B, 2, 8]\n"
              "  return %0\n}\n")
    with pytest.raises(VerifyError, match="'rope'.*overflows fp32"):
        fc.compile(parse_module(scaled))


# ---- item 16: IR errors about parameters and dims point at their line:column

@pytest.mark.parametrize("text, line, col, fragment", [
    ("graph @f(%x: f16[B, 8], %x: f16[B, 8]) {\n  return %x\n}\n", 1, 25,
     "value %x is defined twice"),
    ("graph @f(\n    %x: f16[B, 0]) {\n  return %x\n}\n", 2, 16,
     "bad dimension 0 in f16[B, 0] of %x"),
    ("kernel @k {grid = 1, cluster = 1, threads = 32, max_batch = 1}"
     "(%a: f32[4],\n %b: f32[4], %a: f32[4]) {\n  return %b\n}\n", 2, 14,
     "value %a is defined twice")])
def test_ir_param_and_dim_errors_are_located(text, line, col, fragment):
    with pytest.raises(VerifyError) as info:
        parse_module(text, "t.fir")
    msg = str(info.value)
    assert msg.startswith(f"t.fir:{line}:{col}: verify error: ") and fragment in msg, msg


# ---- item 17: FUSIONC_DUMP needs its after: prefix

@pytest.mark.parametrize("dump, fragment", [("fuse", "lacks 'after:'"), ("all", "lacks"),
                                            ("after:nope", "names no pass")])
def test_dump_request_without_after(monkeypatch, dump, fragment):
    from fusionc.errors import PassError
    from fusionc.passes import run_pipeline
    from tests.passes.graphs import example
    m = example("llama2_7b", hidden=256, heads=2, intermediate=512)
    monkeypatch.setenv("FUSIONC_DUMP", dump)
    with pytest.raises(PassError, match=fragment) as info:
        run_pipeline(fc.module(m["mlp"]), "fold-views,partition-units{max_batch=2}")
    assert "after:all or after:NAME" in str(info.value)


def test_dump_after_a_pass(monkeypatch, capsys):
    from fusionc.passes import run_pipeline
    from tests.passes.graphs import example
    m = example("llama2_7b", hidden=256, heads=2, intermediate=512)
    monkeypatch.setenv("FUSIONC_DUMP", "after:partition-units")
    run_pipeline(fc.module(m["mlp"]), "fold-views,partition-units{max_batch=2}")
    assert "// ----- IR after partition-units" in capsys.readouterr().err
