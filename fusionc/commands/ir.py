"""``fusionc ir``: print the IR of a DSL example or an IR text file."""
from __future__ import annotations

import ast
import sys

from fusionc.cli import command
from fusionc.errors import DSLError

_EPILOG = """\
A .py file is a DSL file: it defines build(**sizes) returning a fusionc.ir.Module (called with
its defaults, or with the sizes given by -D), or else a module-level `module`; its graphs are
traced and printed. A .fir file is IR text: it is parsed, verified and printed again, so
`fusionc ir a.py > a.fir && fusionc ir a.fir` prints the same text twice.

examples:
  fusionc ir examples/llama2_7b.py
  fusionc ir examples/llama3_8b.py -D hidden=512 -D intermediate=1024 --graph mlp
  fusionc ir saved.fir
  fusionc ir examples/llama3_8b.py --after smem-plan --graph mlp   # tile IR + cost table
  fusionc ir examples/llama3_8b.py --max-batch 64 --after attention-units --graph attention
  fusionc ir examples/llama2_7b.py --passes "fold-views,partition-units{max_batch=4}"

With --after or --passes, each kernel's cost (global and DSM bytes, FLOPs, waves, estimated time
on an H200 at --batch/--kv-len) is printed as // comments, so the output still parses.
"""


@command("ir", "print the IR of a DSL file (.py) or re-print an IR text file (.fir)")
def setup(p):
    import argparse
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _EPILOG
    p.add_argument("source", help="a DSL file (.py) or IR text (.fir)")
    p.add_argument("-D", dest="sizes", metavar="NAME=VALUE", action="append", default=[],
                   help="pass a size to build() of a .py file (repeatable), e.g. -D hidden=512")
    p.add_argument("--graph", metavar="NAME", help="print only this graph")
    p.add_argument("--after", metavar="PASS",
                   help="run the default pipeline up to PASS and print the IR after it")
    p.add_argument("--passes", metavar="PIPELINE",
                   help='run this pipeline first, e.g. "fold-views,partition-units{max_batch=4}"')
    from fusionc.commands.compile import positive_int
    p.add_argument("--lowering", choices=("auto", "v2"), default=None,
                   help="each graph's default pipeline for --after: v2 (the same as auto, "
                        "fusionc.compile's choice for that graph: fused streamed kernels, the "
                        "mixed or the library path); lowering v1 was removed")
    p.add_argument("--max-batch", type=positive_int, default=None,
                   help="batch bucket of the v2 pipeline (default 8)")
    p.add_argument("--batch", type=positive_int, default=None,
                   help="batch for the cost table (default 1)")
    p.add_argument("--kv-len", type=positive_int, default=None,
                   help="KV length for the cost table (default 4096)")

    def run(args):
        from fusionc.ir import print_graph, print_module
        for flag, v in (("--after", args.after), ("--passes", args.passes)):
            if v is not None and not v.strip():
                from fusionc.errors import InputError
                raise InputError(f"{flag} {v!r}", valid="a pass name, e.g. --after smem-plan"
                               if flag == "--after" else 'a pipeline, e.g. --passes '
                               '"partition-units{max_batch=8},stream-plan"')
        module = load(args.source, parse_sizes(args.sizes))
        if args.graph in module.names and (args.after or args.passes):
            from fusionc.ir import Module
            module = Module((module[args.graph],))   # passes run on the chosen graph only
        if args.after or args.passes:
            module = run_passes(module, args)
        else:
            _note_unused(args)
        if args.graph is None:
            print(print_module(module), end="")
        elif args.graph in module.names:
            g = module[args.graph]
            launched = [op.attr("kernel").name for op in g.walk() if op.name == "launch"]
            for name in dict.fromkeys(launched):   # the kernels it launches, then the graph
                print(print_graph(module[name]) + "\n")
            print(print_graph(g))
        else:
            raise DSLError(f"no graph named '{args.graph}' in {args.source}",
                           valid=", ".join(module.names))
        return 0
    return run


def load(source: str, sizes: dict):
    """The Module of a .py DSL file (traced) or a .fir IR file (parsed and verified)."""
    if source.endswith(".py"):
        from fusionc.dsl.loader import load_file
        return load_file(source, **sizes)
    if sizes:
        raise DSLError("-D sizes apply only to a .py DSL file", valid=f"drop -D for {source}")
    from fusionc.ir import parse_file
    return parse_file(source)


def parse_sizes(items: list[str]) -> dict:
    """``["hidden=512", "dtype=bf16"]`` → ``{"hidden": 512, "dtype": "bf16"}``.

    Values are Python literals (ints, floats, quoted strings); anything else is a string.
    """
    out = {}
    for item in items:
        name, eq, text = item.partition("=")
        if not eq or not name.isidentifier():
            raise DSLError(f"bad -D {item!r}", valid="-D NAME=VALUE, e.g. -D hidden=512")
        if name in out:
            raise DSLError(f"-D {name} given twice", valid="each size once")
        try:
            out[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[name] = text
    return out


def _pipelines(module, args) -> dict[str, str]:
    """The pipeline of each graph of ``module`` (by name): ``--passes``; else as
    ``fusionc.compile`` picks it for that graph alone
    (:func:`fusionc.runtime.pipelines.v2_default_pipeline` at ``--max-batch``). A module
    that already holds kernels (a lowered .fir) runs as one: its first host graph's."""
    from fusionc.runtime.pipelines import v2_default_pipeline
    mb = getattr(args, "max_batch", None) or 8
    out = {}
    for g in module.graphs:
        if args.passes or g.kind != "graph":
            continue
        out[g.name] = v2_default_pipeline(g, mb)
    if args.passes or any(g.kind != "graph" for g in module.graphs):
        first = args.passes or next(iter(out.values()), None)
        if first is None:
            from fusionc.passes import DEFAULT_PIPELINE
            first = DEFAULT_PIPELINE
        return {g.name: first for g in module.graphs}
    return out


def _no_such_pass(module, args, skipped: list) -> None:
    """PassError: no graph's pipeline has ``--after``'s pass (``skipped``: each group's
    ``(module, names, pass names, pipeline)``)."""
    from fusionc.errors import PassError
    names = list(dict.fromkeys(p for _, _, at, _ in skipped for p in at))
    why = ""
    if "lower-library" in names and not args.passes:
        why = _library_why(module, names, getattr(args, "max_batch", None) or 8)
    raise PassError(f"--after {args.after}: no such pass in the pipeline{why}",
                    valid=", ".join(names))


def _library_why(module, names: list, max_batch: int) -> str:
    """Why lowering v2's default pipeline of ``module`` has no fused passes: ops no fused
    kernel takes (named with their line), else the batch bucket or the cost table."""
    from fusionc.lower.match_v2 import unfused_ops
    from fusionc.runtime.pipelines import first_passes
    graphs = [g for g in module.graphs if g.kind == "graph"]
    rest = [unfused_ops(first_passes(g)) for g in graphs]
    if graphs and all(rest):
        ops = ", ".join(f"{op.name} at {op.loc}" if op.loc else op.name
                        for op in sum(rest, [])[:4])
        return f" (lowering v2 takes the library path: no fused kernel takes {ops})"
    from fusionc.lower.attention_v2 import covers
    if any(op.name == "decode_attention" for g in graphs for op in g.body) and \
            not all(covers(first_passes(g)) for g in graphs):
        return (" (lowering v2 takes the mixed path with the attention on the host: the "
                "attention units do not take its head geometry or block form)")
    path = "the mixed path (cuBLAS GEMMs around attention units)" \
        if "attention-units" in names else "the library path"
    return (f" (lowering v2 takes {path} at --max-batch {max_batch}:"
            " past the fused bucket or where the cost table measured it faster; the"
            " fused kernels: --passes \"$(python -c 'from fusionc.passes.stream"
            f" import v2_pipeline; print(v2_pipeline({max_batch}))')\")")


def _note_unused(args) -> None:
    """A stderr note naming the options given that only act with --after or --passes."""
    given = [flag for flag, v in (("--lowering", args.lowering), ("--max-batch", args.max_batch),
                                  ("--batch", args.batch), ("--kv-len", args.kv_len))
             if v is not None]
    if given:
        verb = "acts" if len(given) == 1 else "act"
        print(f"fusionc: note: {', '.join(given)} only {verb} with --after or --passes "
              "(the traced graphs are printed as they are)", file=sys.stderr)


def _check_batch(kernels, batch: int) -> None:
    """InputError when the cost table's ``--batch`` is past a kernel's batch bucket (its
    launches would refuse that batch)."""
    over = [k.name for k in kernels if k.attr("max_batch") is not None and
            batch > k.attr("max_batch")]
    if over:
        from fusionc.errors import InputError
        top = min(k.attr("max_batch") for k in kernels if k.name in over)
        raise InputError(f"--batch {batch} is past the batch bucket of @{over[0]} ({top})",
                         op=over[0], valid=f"--batch <= {top}, or a larger --max-batch")


def run_passes(module, args):
    """Run ``--passes`` or each graph's default pipeline (:func:`_pipelines`) up to
    ``--after``; print the cost table. Graphs whose pipeline has no ``--after`` pass stay as
    traced (a note on stderr names them and their path); none having it is a PassError."""
    from fusionc.cost.model import cost_table
    from fusionc.ir import Module
    from fusionc.passes import parse_pipeline, run_pipeline
    groups = {}
    for name, text in _pipelines(module, args).items():
        groups.setdefault(text, []).append(name)
    done, skipped = [], []
    for text, names in groups.items():
        passes = parse_pipeline(text)
        part = Module(tuple(module[n] for n in names))
        if args.after:
            at = [p.name for p in passes]
            if args.after not in at:
                skipped.append((part, names, at, text))
                continue
            passes = passes[:at.index(args.after) + 1]
        done.append(run_pipeline(part, passes))
    if not done:
        _no_such_pass(module, args, skipped)
    for part, names, _, text in skipped:
        print(f"fusionc: note: {', '.join('@' + n for n in names)} shown as traced: "
              f"its pipeline has no {args.after} ({text})", file=sys.stderr)
        done.append(part)
    module = Module(tuple(g for m in done for g in m.graphs))
    kernels = [g for g in module.graphs if g.kind == "kernel"]
    if kernels:
        batch, kv = args.batch or 1, args.kv_len or 4096
        _check_batch(kernels, batch)
        table = cost_table(kernels, batch, kv)
        print(f"// cost on an H200 at batch {batch}, KV length {kv} "
              "(fusionc.cost.model)")
        print("\n".join("// " + line for line in table.splitlines()))
    return module
