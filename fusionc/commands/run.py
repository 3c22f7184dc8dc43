"""``fusionc run``: compile an example for the GPU, run it on random inputs, check it against the
float64 interpreter reference, and time it."""
from __future__ import annotations

import argparse

import numpy as np

from fusionc.cli import command
from fusionc.commands.compile import positive_int

_EPILOG = """\
Every graph of the file (or --graph) is compiled for a batch bucket of --batch, run on fresh
random inputs (KV rows of different lengths up to --kv-len, NaN past each length, outputs
poisoned with NaN first), compared with the float64 interpreter (relative error per output;
fp16/bf16 pass at <= 1e-2) and timed (median of CUDA-event times over --reps launches).

examples:
  fusionc run examples/llama2_7b.py --batch 1 --kv-len 4096
  fusionc run examples/llama3_8b.py --batch 4 --kv-len 1024 --dtype bf16
  fusionc run examples/llama2_7b.py --graph mlp --batch 16 --timeline
"""


@command("run", "compile, run on the GPU, check against the reference and time")
def setup(p):
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _EPILOG
    p.add_argument("source", help="a DSL file (.py)")
    p.add_argument("--batch", type=positive_int, default=1, help="batch (rows), default 1")
    p.add_argument("--kv-len", type=positive_int, default=1024,
                   help="longest KV length, default 1024")
    p.add_argument("--dtype", choices=("f16", "bf16"), help="override the example's dtype")
    p.add_argument("--graph", metavar="NAME", help="run only this graph")
    p.add_argument("-D", dest="sizes", metavar="NAME=VALUE", action="append", default=[],
                   help="a size for build() (repeatable)")
    p.add_argument("--reps", type=positive_int, default=50, help="timed launches (default 50)")
    p.add_argument("--split-tokens", type=positive_int, metavar="PARTS",
                   help="token blocks of a many-token graph (1: no split; default 2 with "
                        "collectives, else 1)")
    from fusionc.commands.compile import add_lowering_arg
    add_lowering_arg(p)
    p.add_argument("--timeline", action="store_true",
                   help="profiling build: print each kernel's time per op (last launch; "
                        "fusionc.runtime.timeline); profiles the cost table's choice, not a "
                        "stored autotuned one")

    def run(args):
        return run_main(args)
    return run


def run_main(args) -> int:
    """Run ``fusionc run`` (see the command's help); returns 0 when every graph passes."""
    from fusionc.commands.ir import load, parse_sizes
    from fusionc.errors import DSLError
    sizes = parse_sizes(args.sizes)
    if args.source.endswith(".py"):
        from fusionc.dsl.loader import build_parameters
        params = build_parameters(args.source)
        if args.dtype:
            sizes["dtype"] = args.dtype
        if "max_seq" in params:  # the KV cache holds --kv-len tokens
            sizes.setdefault("max_seq", args.kv_len)
    module = load(args.source, sizes)
    graphs = [g for g in module.graphs if g.kind == "graph" and args.graph in (None, g.name)]
    if not graphs:
        raise DSLError(f"no graph named '{args.graph}'", valid=", ".join(module.names))
    status = 0
    for g in graphs:
        line, ok = run_graph(g, args)
        print(line)
        status |= 0 if ok else 1
    return status


def _lowering(args) -> str | None:
    """``--lowering`` as ``fusionc.compile`` takes it (auto: None, its default)."""
    low = getattr(args, "lowering", "auto")
    return None if low == "auto" else low


def run_graph(g, args) -> tuple[str, bool]:
    """Compile, run, check and time one graph; returns the report line and pass/fail."""
    import fusionc
    from fusionc.commands.compile import random_inputs
    from fusionc.interp.numerics import defined_relative_error
    from fusionc.interp import interpret
    from fusionc.runtime.transfer import download
    from fusionc.runtime.arrays import require_gpu
    from fusionc.codegen import CodegenOptions
    comm, group = _communicator(g)
    timeline = getattr(args, "timeline", False)
    fn = fusionc.compile(g, max_batch=args.batch, kv_len=args.kv_len,
                         comm=comm, split_tokens=getattr(args, "split_tokens", None),
                         codegen=CodegenOptions(timeline=True) if timeline else None,
                         lowering=_lowering(args))
    require_gpu()
    seed = np.random.SeedSequence().entropy % 2**32
    if comm is not None:   # the ranks share the seed: replicated inputs stay replicated
        seed = comm.group.all_gather(seed)[0]
    rng = np.random.default_rng(seed)
    inputs = random_inputs(g, args.batch, rng, max_len=args.kv_len)
    dev = _upload(g, inputs)
    outs = fn(**dev)
    rows = _sample_rows(g, args.batch, rng)
    sample = {k: (v[rows] if rows is not None and _token_rows(g, k) else v)
              for k, v in inputs.items()}
    ref = interpret(g, sample, precise=True) if comm is None else \
        interpret(g, [sample] * group, precise=True)[comm.rank]
    errs = [defined_relative_error(download(o, v.type.dtype)[rows if rows is not None
                                                              else slice(None)], r)
            for o, v, r in zip(outs, g.outputs, ref)]
    tol = 1e-4 if all(v.type.dtype.value == "f32" for v in g.outputs) else 1e-2
    ok = all(e <= tol for e in errs)
    us = _time(fn, dev, args.reps)
    host = sorted({op.name if op.name != "library_call" else op.attr("fn")
                   for op in fn.host.body if op.name != "launch"})
    kernels = ", ".join([f"{k.source.name} (C={k.source.cluster})" for k in fn.kernels.values()]
                        + [f"host ops {' '.join(host)}"] * bool(host))
    checked = f" ({len(rows)} sampled rows checked)" if rows is not None else ""
    if timeline:
        from fusionc.runtime import timeline as tl
        for name, stamps in tl.read(fn).items():
            print(f"@{g.name} {name} (timeline build, µs since the first CTA's entry):")
            print(tl.table(stamps))
    return (f"@{g.name}: batch {args.batch}, KV <= {args.kv_len}{checked}: "
            + ", ".join(f"{v.name} err {e:.1e}" for v, e in zip(g.outputs, errs))
            + f" {'ok' if ok else 'FAILED'}; {us:.1f} µs per call; kernels {kernels}"), ok


def _token_rows(g, name: str) -> bool:
    """Whether parameter ``name`` has the token (batch) dim first: the symbolic leading dim of
    the graph's first such parameter."""
    sym = next((p.type.shape[0] for p in g.params if p.type.rank and
                isinstance(p.type.shape[0], str)), None)
    p = next(p for p in g.params if p.name == name)
    return sym is not None and p.type.rank >= 1 and p.type.shape[0] == sym


def _sample_rows(g, batch: int, rng):
    """For graphs of many independent rows (no attention, batch > 256): 64 rows to check
    against the float64 interpreter (a full reference would take minutes); else None."""
    if batch <= 256 or any(op.name in ("decode_attention", "kv_cache_append",
                                       "mla_decode_attention") for op in g.body):
        return None
    return np.sort(rng.choice(batch, 64, replace=False))


def _communicator(g):
    """(Communicator, group) for a graph with tensor-parallel collectives, else (None, 1)."""
    groups = {op.attr("group") for op in g.body if op.name.startswith("all_reduce")}
    if not groups:
        return None, 1
    from fusionc.comm import Communicator
    from fusionc.comm.group import _env_int
    from fusionc.errors import InputError
    world = _env_int("WORLD_SIZE", 1)
    if groups != {world}:
        raise InputError(f"@{g.name} all-reduces over {sorted(groups)} ranks but "
                         f"WORLD_SIZE = {world}", op="run",
                         valid=f"fusionc launch -n {max(groups)} -- python3 -m fusionc run ...")
    return Communicator(), world


def _upload(g, inputs):
    from fusionc.runtime.transfer import upload
    return {p.name: upload(inputs[p.name], p.type.dtype) for p in g.params}


def _time(fn, dev, reps: int) -> float:
    """Median µs per call (CUDA events around each call, after warm-up). The KV caches are
    updated in place at the same position every call, so repeated calls stay valid."""
    import statistics
    import cupy
    for _ in range(3):
        fn(**dev)
    times = []
    for _ in range(reps):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record()
        fn(**dev)
        e.record()
        e.synchronize()
        times.append(cupy.cuda.get_elapsed_time(s, e) * 1e3)
    return statistics.median(times)
