"""``fusionc compile``: the main job — DSL example to IR stages, CUDA and sm_90a cubins (no GPU
needed), with a simulator check against the interpreter."""
from __future__ import annotations

import argparse
import pathlib

from fusionc.cli import command

_EPILOG = """\
writes into DIR:
  <graph>.0-input.fir, <graph>.1-fuse-allreduce-norm.fir, ...  the IR after each pass
  <kernel>.cu, <kernel>.cubin                                 CUDA source and sm_90a cubin
and prints per kernel: grid, cluster size, threads, registers, shared memory, spills; then the
simulator check ("checking @GRAPH ..." as it starts): the lowered module run by the tile-IR
simulator on random inputs against the graph-IR interpreter, the relative error per output
(unnamed results as "output N") and ok when each is within the tolerance (1e-02). A graph
lowered to library calls says so; an already lowered input has no check (it says skipped).

examples:
  fusionc compile examples/llama2_7b.py -o /tmp/out
  fusionc compile examples/llama3_8b.py -o /tmp/l3 --cluster 8 --graph attention
"""


@command("compile", "compile a DSL file to CUDA and sm_90a cubins (no GPU needed)")
def setup(p):
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _EPILOG
    p.add_argument("source", help="a DSL file (.py) or IR text (.fir)")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("-D", dest="sizes", metavar="NAME=VALUE", action="append", default=[],
                   help="a size for build() of a .py file (repeatable)")
    p.add_argument("--graph", metavar="NAME", help="compile only this graph")
    p.add_argument("--cluster", type=int, default=0, choices=(0, 1, 2, 4, 8, 16),
                   help="cluster size (0: cost model)")
    p.add_argument("--scheme", default="auto", choices=("auto", "splitk", "splitn"),
                   help="QKV (attention) and gate/up (MLP) scheme")
    p.add_argument("--max-batch", type=positive_int, default=8,
                   help="batch bucket (default 8)")
    p.add_argument("--passes", metavar="PIPELINE", help="pipeline string (overrides the above)")
    p.add_argument("--no-check", action="store_true", help="skip the simulator check")

    def run(args):
        return compile_main(args)
    return run


def compile_main(args) -> int:
    """Run ``fusionc compile`` (see the command's help); returns the exit status."""
    from fusionc.codegen.compile import compile_kernel
    from fusionc.commands.ir import load, parse_sizes
    from fusionc.ir import Module, print_module
    from fusionc.passes import run_pipeline
    from fusionc.comm.kernel import compile_spec
    from fusionc.comm.kernel import render as render_comm
    from fusionc.errors import DSLError
    from fusionc.runtime.compiled import check_launches_only
    module = load(args.source, parse_sizes(args.sizes))
    graphs = [g for g in module.graphs if g.kind == "graph"
              and (args.graph is None or g.name == args.graph)]
    if not graphs:
        what = f"no graph named '{args.graph}'" if args.graph else f"no graph in {args.source}"
        raise DSLError(what, valid=", ".join(g.name for g in module.graphs
                                             if g.kind == "graph") or "a file with a graph")
    out = make_out_dir(args.out)
    lowered_input = any(g.kind == "kernel" for g in module.graphs)
    from fusionc.runtime.compiled import pipeline_for
    failed = False
    for g in graphs:
        stage = [0]

        def dump(spec, m, g=g, stage=stage):
            stage[0] += 1
            name = spec.split("{")[0]
            (out / f"{g.name}.{stage[0]}-{name}.fir").write_text(print_module(m))
        if lowered_input:  # an already lowered module (e.g. a saved *-fuse.fir): its kernels
            lowered = module
        else:
            (out / f"{g.name}.0-input.fir").write_text(print_module(Module((g,))))
            pipeline = args.passes or pipeline_for(g, args.max_batch, args.cluster, args.scheme)
            lowered = run_pipeline(Module((g,)), pipeline, on_stage=dump)
        for line in lowering_notes(g.name, lowered):
            print(line)
        check_launches_only(lowered[g.name])
        specs = comm_specs(lowered[g.name])   # before any kernel: size errors come first
        for k in (x for x in lowered.graphs if x.kind == "kernel"):
            ck = compile_kernel(k)
            (out / f"{k.name}.cu").write_text(ck.source.source)
            (out / f"{k.name}.cubin").write_bytes(ck.cubin)
            print(ck.report())
        for spec in specs:   # the collectives' kernels (both algorithms, every chunk)
            result, _ = compile_spec(spec)
            (out / f"{spec.name}.cu").write_text(render_comm(spec))
            (out / f"{spec.name}.cubin").write_bytes(result.cubin)
            print(f"{spec.name}: {spec.threads} threads, {result.kernels[spec.name].registers} "
                  "registers (all_reduce over NVLink peer-to-peer)")
        if args.no_check or lowered_input:
            print(f"simulator check @{g.name} skipped: "
                  + ("--no-check" if args.no_check else "the input is already lowered (no "
                     "graph IR to compare with; check its graph IR file instead)"))
        else:
            mb = min([k.attr("max_batch") for k in lowered.graphs if k.kind == "kernel"]
                     or [args.max_batch])
            print(f"checking @{g.name} in the simulator (batch {_check_batch(g, mb)}) ...",
                  flush=True)
            try:
                line = simulator_check(g, lowered, _check_batch(g, mb))
            except MemoryError:
                from fusionc.errors import InputError
                raise InputError(f"the simulator check of @{g.name} does not fit in memory "
                                 "(random inputs at these sizes)",
                                 valid="smaller sizes (-D), or --no-check") from None
            print(line)
            failed = failed or line.endswith("FAILED")
    print(f"wrote {out}/")
    return 1 if failed else 0


def _check_batch(g, max_batch: int) -> int:
    """Rows for the simulator check: the graph's static batch (the length of its integer
    vectors, positions and seq_lens, else the first input's leading dim), else 2 (at most
    max_batch)."""
    ints = [p.type.shape[0] for p in g.params if p.type.rank == 1 and not p.type.dtype.is_float]
    first = [p.type.shape[0] for p in g.params[:1] if p.type.rank]
    lead = (ints or first or ["B"])[0]
    return lead if isinstance(lead, int) else max(1, min(2, max_batch))


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


def simulator_check(g, lowered, batch: int = 2, seed: int = 0) -> str:
    """Run the lowered module in the simulator and the graph in the interpreter on the same
    random inputs; one line with the relative error of each output."""
    import numpy as np
    from fusionc.interp import interpret
    from fusionc.interp.numerics import defined_relative_error
    from fusionc.sim import simulate
    from fusionc.interp.numerics import round_to
    rng = np.random.default_rng(seed)
    # rounded to the parameter dtypes once: the interpreter and the simulator then only copy
    drawn = random_inputs(g, batch, rng)
    args = {p.name: round_to(drawn[p.name], p.type.dtype) for p in g.params}
    groups = [op.attr("group") for op in g.body if op.name.startswith("all_reduce")]
    if groups:   # tensor parallelism: every simulated rank gets the same inputs
        ranks = [args] * max(groups)
        ref, got = interpret(g, ranks)[0], simulate(lowered, ranks, graph=g.name)[0]
    else:
        ref, got = interpret(g, args), simulate(lowered, args, graph=g.name)
    errs = [defined_relative_error(a, r) for a, r in zip(got, ref)]
    ok = all(e <= CHECK_TOLERANCE for e in errs)
    return (f"simulator check @{g.name} (batch {batch}, relative error per output, tolerance "
            f"{CHECK_TOLERANCE:.0e}): "
            + ", ".join(f"{output_label(v, i)} {e:.1e}"
                        for i, (v, e) in enumerate(zip(g.outputs, errs)))
            + (" ok" if ok else " FAILED"))


CHECK_TOLERANCE = 1e-2   # norm-wise relative error, simulator vs interpreter, per output


def output_label(v, i: int) -> str:
    """How the check line names output ``i`` (value ``v``): its name, or ``output i`` for an
    unnamed result (``%0``: a returned expression such as ``x + linear(...)``)."""
    return f"output {i}" if v.name.isdigit() else v.name


def lowering_notes(name: str, lowered) -> list[str]:
    """Lines that say how graph ``name`` was lowered when it is not one fused kernel per block:
    library calls (cuBLAS GEMMs, CuPy kernels) instead of fusionc kernels."""
    host = lowered[name]
    calls = [op for op in host.body if op.name == "library_call"]
    if not calls:
        return []
    kernels = sum(op.name == "launch" for op in host.body)
    fused = f"{kernels} fused kernel launch(es)" if kernels else "no fused kernel"
    return [f"@{name}: {len(calls)} library call(s) (cuBLAS GEMMs for the linear layers, pass "
            "lower-library: many tokens, or no block the fused kernels cover), the other ops as "
            f"CuPy kernels; {fused}"]


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


def random_inputs(g, batch: int, rng, max_len: int = 37) -> dict:
    """Fresh random inputs (float32): weights scaled by 1/sqrt(fan-in), KV rows of different
    lengths in 1..min(max_len, max_seq) (the first row the longest) with NaN past each length,
    positions = length - 1, seq_lens = length. Caches are the rank-4 parameters
    ``[B, S, kv_heads, D]`` and rank-3 parameters named ``*cache*`` (MLA's ``[B, S, W]``); only
    their rows below the longest length are drawn (the rest is NaN, and costly to draw)."""
    import numpy as np
    caches = [p for p in g.params
              if p.type.rank == 4 or (p.type.rank == 3 and "cache" in p.name)]
    lens = None
    if caches:
        top = min(max_len, caches[0].type.shape[1])
        lens = rng.integers(1, top + 1, batch)
        lens[0] = top
    out = {}
    for p in g.params:
        shape = tuple(batch if isinstance(d, str) else d for d in p.type.shape)
        if p in caches:
            a = np.full(shape, np.nan, np.float32)
            rows = min(int(lens.max()), shape[1])
            a[:, :rows] = rng.standard_normal((shape[0], rows, *shape[2:]), dtype=np.float32)
            a[np.arange(shape[1])[None, :] >= lens[:, None]] = np.nan
            out[p.name] = a
        elif p.type.dtype.is_float:
            a = rng.standard_normal(shape, dtype=np.float32)
            if len(shape) == 2 and shape[0] != batch:
                a /= np.sqrt(shape[1])
            out[p.name] = a
    for p in g.params:
        if not p.type.dtype.is_float:
            n = lens if lens is not None else np.ones(batch, int)
            out[p.name] = (n - (p.name.startswith("pos"))).astype(p.type.dtype.numpy)
    return out
