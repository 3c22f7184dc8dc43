"""Configurations that cannot work are rejected before NVRTC with a clear fusionc error."""
from __future__ import annotations

import pytest

from fusionc.cli import main
from fusionc.codegen import compile_kernel, generate_cuda
from fusionc.errors import CompileError, FusionError
from fusionc.ir import parse_module
from fusionc.runtime.nvrtc import NVRTCError, compile_cubin
from tests.codegen import programs as P
from tests.sim.programs import collective_kernel


def kernel(text: str, verify: bool = False):
    return parse_module(text, verify=verify).graphs[0]


def test_shared_memory_over_the_limit():
    text = collective_kernel("sum", 2, 1, (1,), "f32").replace(
        "%y: f32[2, 1]", "%y: f32[2, 1], %big: f16[B, 16384]").replace(
        "cluster = 2,", "cluster = 2, max_batch = 8,").replace(
        "  store(%y", "  %b = load(%big) {offsets = [\"0\", \"0\"], sizes = [B, 16384]} : "
        "f16[B, 16384]\n  store(%big, %b) {offsets = [\"0\", \"0\"]}\n  store(%y").replace(
        "return %y", "return %y, %big")
    with pytest.raises(CompileError, match=r"needs 262\d+ bytes of shared memory per CTA "
                       r"\(max_batch = 8\); largest: b \(262144 B\).*at most 232448 bytes"):
        generate_cuda(kernel(text))


def test_cluster_size_32():
    text = collective_kernel("sum", 16, 1, (4,), "f32").replace("cluster = 16", "cluster = 32")
    with pytest.raises(CompileError, match=r"cluster size 32 \(valid: 1, 2, 4, 8 or 16"):
        generate_cuda(kernel(text))


def test_cluster_16_needs_nonportable():
    text = collective_kernel("sum", 16, 1, (4,), "f32").replace("nonportable = true, ", "")
    with pytest.raises(CompileError, match="cluster size 16 without nonportable = true"):
        generate_cuda(kernel(text))


@pytest.mark.parametrize("d,dtype", [(68, "f16"), (36, "bf16"), (70, "f32")])
def test_head_dim_not_a_multiple_of_the_vector_width(d, dtype):
    with pytest.raises(CompileError) as e:
        generate_cuda(kernel(P.attention_kernel(head_dim=d, dtype=dtype), verify=True))
    assert f"head_dim {d} of a {dtype} cache" in str(e.value)
    assert "valid: head_dim a multiple of" in str(e.value)
    assert e.value.loc is not None and e.value.op == "attn_partial"


def test_head_dim_72_is_accepted():
    generate_cuda(kernel(P.attention_kernel(head_dim=72), verify=True))


def test_unknown_op_names_the_op_and_line():
    text = collective_kernel("sum", 2, 1, (4,), "f32").replace(
        "  cluster_barrier()\n  %r", "  %z = all_reduce(%p) {group = 2} : f32[1, 4]\n"
        "  cluster_barrier()\n  %r", 1)
    with pytest.raises(CompileError) as e:
        generate_cuda(kernel(text))
    msg = str(e.value)
    assert "'all_reduce': no CUDA code generation for this op inside a kernel" in msg
    assert msg.startswith("6:8: compile error")


def test_partially_overlapping_grid_reduce_windows():
    text = P.grid_sum(2, 1, 8).replace('offsets = ["0", "0"]}', 'offsets = ["0", "4*rank"]}')
    text = text.replace("%y: f32[1, 8]", "%y: f32[1, 12]")
    with pytest.raises(CompileError, match=r"output windows at offsets \[0, 0\] and \[0, 4\] "
                                           r"of tile \[1, 8\] partially overlap"):
        generate_cuda(kernel(text))


def test_symbolic_gemv_k():
    text = ("kernel @g {grid = 1, cluster = 1} (%x: f16[B, B], %w: f16[8, 16], %y: f32[B, 8]) {\n"
            "  %t = load(%x) {offsets = [\"0\", \"0\"], sizes = [B, B]} : f16[B, B]\n"
            "  %p = gemv(%t, %w) {row = \"0\", col = \"0\", rows = 8} : f32[B, 8]\n"
            "  store(%y, %p) {offsets = [\"0\", \"0\"]}\n  return %y\n}\n")
    with pytest.raises(CompileError, match="gemv over a symbolic K"):
        generate_cuda(kernel(text))


def test_nvrtc_error_is_a_compile_error():
    with pytest.raises(CompileError) as e:
        compile_cubin("__global__ void k() { nope; }", name="bad.cu")
    assert isinstance(e.value, NVRTCError) and isinstance(e.value, FusionError)
    assert "identifier \"nope\" is undefined" in e.value.log
    assert str(e.value).startswith("compile error: NVRTC failed to compile bad.cu")


def test_cli_prints_compile_errors_without_traceback(tmp_path, capsys, monkeypatch):
    """A CompileError raised inside a command surfaces as one 'fusionc: ...' line."""
    from fusionc import cli

    def boom(p):
        def run(args):
            compile_kernel(kernel(collective_kernel("sum", 16, 1, (4,), "f32").replace(
                "cluster = 16", "cluster = 32")))
        return run
    monkeypatch.setitem(cli.COMMANDS, "boom", ("test", boom))
    assert main(["boom"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fusionc: 2:1: compile error: 'coll': cluster size 32")
    assert "Traceback" not in err


@pytest.mark.parametrize("kw", [dict(attn_stream=3), dict(gemv_mma_pipeline=-1),
                                dict(load_batch=0), dict(gemv_unroll=64),
                                dict(grid_reduce_parallel=2), dict(gemv_mma_batch=1.5),
                                dict(attn_stream=True)])
def test_codegen_options_out_of_range_are_named(kw):
    from fusionc.codegen import CodegenOptions
    from fusionc.errors import CompileError
    (name, value), = kw.items()
    with pytest.raises(CompileError, match=f"CodegenOptions.{name} = {value!r}.*valid: an "
                                           "integer from"):
        CodegenOptions(**kw)


@pytest.mark.parametrize("spec,fragment", [
    ("bogus=1", "NAME one of delay, gemv_unroll"), ("attn_stream", "NAME=INTEGER"),
    ("attn_stream=x", "'x' is not an integer"), ("attn_stream=7", "from 0 to 2")])
def test_codegen_option_strings_are_checked(spec, fragment):
    from fusionc.codegen.context import parse_codegen_options
    from fusionc.errors import CompileError
    with pytest.raises(CompileError, match=fragment):
        parse_codegen_options(spec)


def test_codegen_option_strings_parse():
    from fusionc.codegen import CodegenOptions
    from fusionc.codegen.context import parse_codegen_options
    assert parse_codegen_options(" gemv_mma_batch=0, load_batch=4,") == CodegenOptions(
        gemv_mma_batch=0, load_batch=4)
