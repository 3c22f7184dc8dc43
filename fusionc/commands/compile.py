"""``fusionc compile``: the main job — DSL example to IR stages, CUDA and sm_90a cubins (no GPU
needed), with a simulator check against the interpreter."""
from __future__ import annotations

import argparse
import pathlib

from fusionc.cli import command
from fusionc.commands.check import (  # noqa: F401  (public here: fusionc.tune, tests)
    check_batch, check_plan, lowering_notes, random_inputs, simulator_check)

_EPILOG = """\
writes into DIR:
  <graph>.0-input.fir, <graph>.1-fold-views.fir, ...  the IR after each pass of the graph's
    pipeline (the fused kernels: ... <graph>.6-smem-plan.fir; the mixed and library paths:
    ... <graph>.4-lower-library.fir)
  <kernel>.cu, <kernel>.cubin                                 CUDA source and sm_90a cubin
and prints per kernel: grid, cluster size, threads, registers, shared memory, spills; then the
simulator check ("checking @GRAPH ..." as it starts): the lowered module run by the tile-IR
simulator on random inputs against the graph-IR interpreter, the relative error per output
(unnamed results as "output N") and ok when each is within the tolerance (1e-02). A graph
lowered to library calls says so; an already lowered input has no check (it says skipped).

examples:
  fusionc compile examples/llama2_7b.py -o /tmp/out
  fusionc compile examples/llama3_8b.py -o /tmp/l3 --max-batch 64 --graph attention
  fusionc compile examples/linear_v2.py -o /tmp/lin --lowering v2 --max-batch 4
"""


DEFAULT_MAX_BATCH = 8


@command("compile", "compile a DSL file to CUDA and sm_90a cubins (no GPU needed)")
def setup(p):
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _EPILOG
    p.add_argument("source", help="a DSL file (.py) or IR text (.fir)")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("-D", dest="sizes", metavar="NAME=VALUE", action="append", default=[],
                   help="a size for build() of a .py file (repeatable)")
    p.add_argument("--graph", metavar="NAME", help="compile only this graph")
    p.add_argument("--max-batch", type=positive_int, default=None,
                   help=f"batch bucket (default {DEFAULT_MAX_BATCH})")
    p.add_argument("--passes", metavar="PIPELINE", help="pipeline string (overrides the above)")
    add_lowering_arg(p)
    p.add_argument("--no-check", action="store_true", help="skip the simulator check")

    def run(args):
        return compile_main(args)
    return run


def add_lowering_arg(p) -> None:
    """``--lowering`` of ``fusionc compile`` and ``run``."""
    p.add_argument("--lowering", choices=("auto", "v2"), default="auto",
                   help="v2 (the same as auto, the default): streamed persistent kernels over "
                        "every SM (graphs of linear, norm, view and elementwise ops, attention "
                        "blocks as v2 linears around attention units, MLA blocks around the "
                        "MLA units; the mixed or library path where the cost table measured "
                        "it faster or the fused kernels do not take the graph); lowering v1's "
                        "cluster kernels were removed")


def compile_main(args) -> int:
    """Run ``fusionc compile`` (see the command's help); returns the exit status.

    Raises:
        FusionError: bad input; InputError for lowering options given with an already
            lowered .fir file, or files that cannot be written.
    """
    from fusionc.commands.ir import load, parse_sizes
    from fusionc.ir.fp32 import check_fp32_attrs
    if getattr(args, "passes", None) is not None and not args.passes.strip():
        from fusionc.errors import InputError
        raise InputError(f"--passes {args.passes!r}", valid='a pipeline, e.g. --passes '
                         '"partition-units{max_batch=8},stream-plan", or none (the default)')
    module = load(args.source, parse_sizes(args.sizes))
    check_fp32_attrs(module)   # fp32 on the GPU and in the check's arithmetic
    graphs = _chosen_graphs(module, args)
    lowered_input = any(g.kind == "kernel" for g in module.graphs)
    if lowered_input:
        _refuse_lowering_options(args)
    out = make_out_dir(args.out)
    failed, done = False, set()
    for g in graphs:
        lowered = module if lowered_input else _lower(g, args, out)
        for line in lowering_notes(g.name, lowered):
            print(line)
        _compile_kernels(lowered, g.name, out, done if lowered_input else set(),
                         lowered_input)
        if args.no_check or lowered_input:
            print(f"simulator check @{g.name} skipped: "
                  + ("--no-check" if args.no_check else "the input is already lowered (no "
                     "graph IR to compare with; check its graph IR file instead)"))
        else:
            failed = not _check(g, lowered, args) or failed
    print(f"wrote {out}/")
    return 1 if failed else 0


def _chosen_graphs(module, args) -> list:
    from fusionc.errors import DSLError
    graphs = [g for g in module.graphs if g.kind == "graph"
              and (args.graph is None or g.name == args.graph)]
    if not graphs:
        what = f"no graph named '{args.graph}'" if args.graph else f"no graph in {args.source}"
        raise DSLError(what, valid=", ".join(g.name for g in module.graphs
                                             if g.kind == "graph") or "a file with a graph")
    return graphs


_LOWERING_OPTIONS = (("max_batch", "--max-batch", None), ("passes", "--passes", None),
                     ("lowering", "--lowering", "auto"))


def _refuse_lowering_options(args) -> None:
    """An already lowered module has its batch and passes fixed."""
    from fusionc.errors import InputError
    given = [flag for attr, flag, default in _LOWERING_OPTIONS
             if getattr(args, attr) != default]
    if given:
        raise InputError(f"{', '.join(given)} given for {args.source}, which is already lowered "
                         "(it has kernels)", valid=f"drop {', '.join(given)}, or compile the "
                         "graph-IR file (e.g. <graph>.0-input.fir)")


def _lower(g, args, out: pathlib.Path):
    """Run the pipeline on ``g``, writing the IR before and after every pass into ``out``."""
    from fusionc.ir import Module, print_module
    from fusionc.passes import run_pipeline
    stage = [0]

    def dump(spec, m):
        stage[0] += 1
        write_file(out / f"{g.name}.{stage[0]}-{spec.split('{')[0]}.fir", print_module(m))
    max_batch = args.max_batch or DEFAULT_MAX_BATCH
    _remove_stale_stages(out, g.name)
    write_file(out / f"{g.name}.0-input.fir", print_module(Module((g,))))   # checked first
    if args.passes:   # the default is not computed: its matcher may refuse what --passes takes
        pipeline = args.passes
    else:
        from fusionc.runtime.pipelines import v2_default_pipeline
        pipeline = v2_default_pipeline(g, max_batch)
    how = "--passes" if args.passes else "lowering v2"
    print(f"lowering @{g.name} at --max-batch {max_batch}: {how}: {pipeline}")
    return run_pipeline(Module((g,)), pipeline, on_stage=dump)


def _remove_stale_stages(out: pathlib.Path, name: str) -> None:
    """Delete ``<name>.<N>-<pass>.fir`` left by an earlier compile into ``out`` (another
    lowering has other passes): the folder then shows exactly this run's stages."""
    import glob
    import re
    stage = re.compile(re.escape(name) + r"\.\d+-[\w-]+\.fir")
    for f in out.glob(f"{glob.escape(name)}.*.fir"):
        if stage.fullmatch(f.name):
            try:
                f.unlink()
            except OSError:
                pass   # write_file names the problem if this stage is written again


def _compile_kernels(lowered, name: str, out: pathlib.Path, done: set, only_launched: bool):
    """Compile the kernels and collectives host graph ``name`` launches (those not in
    ``done`` yet: a lowered file's graphs may share kernels); write .cu and .cubin files."""
    from fusionc.codegen.compile import compile_kernel
    from fusionc.comm.kernel import compile_spec
    from fusionc.comm.kernel import render as render_comm
    from fusionc.runtime.compile_args import check_launches_only
    host = lowered[name]
    check_launches_only(host)
    specs = comm_specs(host)   # before any kernel: size errors come first
    launched = {op.attr("kernel").name for op in host.body if op.name == "launch"}
    for k in lowered.graphs:
        if k.kind != "kernel" or k.name in done or (only_launched and k.name not in launched):
            continue
        done.add(k.name)
        ck = compile_kernel(k)
        write_file(out / f"{k.name}.cu", ck.source.source)
        write_file(out / f"{k.name}.cubin", ck.cubin)
        print(ck.report())
    for spec in specs:   # the collectives' kernels (both algorithms, every chunk)
        if spec.name in done:
            continue
        done.add(spec.name)
        result, _ = compile_spec(spec)
        write_file(out / f"{spec.name}.cu", render_comm(spec))
        write_file(out / f"{spec.name}.cubin", result.cubin)
        print(f"{spec.name}: {spec.threads} threads, {result.kernels[spec.name].registers} "
              "registers (all_reduce over NVLink peer-to-peer)")


def _check(g, lowered, args) -> bool:
    """Print the simulator check's line (or why it is skipped); False when it FAILED."""
    from fusionc.errors import InputError
    mb = min([k.attr("max_batch") for k in lowered.graphs if k.kind == "kernel"]
             or [args.max_batch or DEFAULT_MAX_BATCH])
    batch, skip = check_plan(g, check_batch(g, mb))
    if skip:
        print(skip)
        return True
    print(f"checking @{g.name} in the simulator (batch {batch}) ...", flush=True)
    try:
        line = simulator_check(g, lowered, batch)
    except MemoryError:
        raise InputError(f"the simulator check of @{g.name} does not fit in memory "
                         "(random inputs at these sizes)",
                         valid="smaller sizes (-D), or --no-check") from None
    print(line)
    return not line.endswith("FAILED")


def write_file(path: pathlib.Path, data: str | bytes) -> None:
    """Write text or bytes to ``path``; InputError (naming the file and why) when it cannot be
    written: a read-only folder, a folder in its place, a name too long."""
    import errno

    from fusionc.errors import InputError
    try:
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
    except OSError as e:
        valid = {errno.ENAMETOOLONG: "a shorter graph name (file names are at most 255 bytes)",
                 errno.EISDIR: f"remove the folder {path.name} or choose another -o",
                 }.get(e.errno, "a writable output folder (-o)")
        raise InputError(f"cannot write {path}: {e.strerror or e}", valid=valid) from None


def make_out_dir(path: str) -> pathlib.Path:
    """Create the output folder; InputError when it cannot be."""
    from fusionc.errors import InputError
    if not path:
        raise InputError("empty output folder", valid="-o DIR")
    out = pathlib.Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create output folder {out}: {e.strerror}",
                         valid="a writable folder path") from None
    return out


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not positive")
    return n


def codegen_options_arg(spec: str):
    """argparse type: ``CodegenOptions`` from ``"name=int,..."``
    (``fusionc.codegen.context.parse_codegen_options``), its error as the usage message."""
    from fusionc.codegen.context import parse_codegen_options
    from fusionc.errors import FusionError
    try:
        return parse_codegen_options(spec)
    except FusionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def comm_specs(host) -> list:
    """The all-reduce kernels that the collectives of lowered host graph ``host`` may launch:
    one-shot and two-shot, every chunk size a call can pick (:mod:`fusionc.comm.kernel`)."""
    import dataclasses

    from fusionc.comm.kernel import spec_for
    from fusionc.runtime.comm_ops import COMM_OPS
    from fusionc.errors import CompileError, FusionError
    out = []
    for op in host.body:
        if op.name not in COMM_OPS:
            continue
        t = op.operands[0].type
        if t.rank < 1 or not isinstance(t.shape[-1], int):
            raise CompileError(f"all-reduce of {t}", op=op.name, loc=op.loc,
                               valid="rows [..., D] with a fixed D (the GPU kernels move rows)")
        for two in (False, True):
            try:
                s = spec_for(op.attr("group"), t.shape[-1], t.dtype.value,
                             op.name != "all_reduce", op.name.endswith("norm"), two)
            except FusionError as e:
                raise e.with_loc(op.loc) from None
            out += [dataclasses.replace(s, chunk=c) for c in (1, 2, 4, 8) if c <= s.chunk]
    return list(dict.fromkeys(out))
