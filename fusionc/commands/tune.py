"""``fusionc tune``: autotune the kernels of an example on the GPU and store the choices."""
from __future__ import annotations

from fusionc.cli import command
from fusionc.commands.compile import positive_int


@command("tune", "measure kernel choices on the GPU (fused 64- or 128-row tiles, chained or "
                 "not, an attention block in one kernel or not, the library or the mixed path); "
                 "store the fastest")
def setup(p):
    p.add_argument("source", help="a DSL file (.py) or graph-IR text (.fir)")
    p.add_argument("--batch", type=positive_int, default=1, help="batch bucket (default 1)")
    p.add_argument("--kv-len", type=positive_int, default=4096, help="KV length (default 4096)")
    p.add_argument("--graph", metavar="NAME", help="tune only this graph")
    p.add_argument("--compile-only", action="store_true",
                   help="only compile every candidate into the cubin cache (no GPU needed)")
    p.add_argument("-D", dest="sizes", metavar="NAME=VALUE", action="append", default=[],
                   help="a size for build() (repeatable)")

    def run(args):
        from fusionc.commands.ir import load, parse_sizes
        from fusionc.dsl.loader import build_parameters
        from fusionc.tune import autotune
        from fusionc.tune.search import compile_candidates
        sizes = parse_sizes(args.sizes)
        if "max_seq" in build_parameters(args.source):
            sizes.setdefault("max_seq", args.kv_len)
        module = load(args.source, sizes)
        if any(g.kind == "kernel" for g in module.graphs):
            from fusionc.errors import InputError
            raise InputError(f"{args.source} is already lowered (it has kernels): there is "
                             "nothing left to tune", valid="a DSL file (.py) or graph-IR "
                             "text (.fir), e.g. <graph>.0-input.fir of fusionc compile")
        if args.graph is not None and args.graph not in module.names:
            from fusionc.errors import DSLError
            raise DSLError(f"no graph named '{args.graph}'", valid=", ".join(module.names))
        for g in module.graphs:
            if g.kind != "graph" or args.graph not in (None, g.name):
                continue
            if args.compile_only:
                n = len(compile_candidates(g, args.batch, args.kv_len))
                print(f"@{g.name}: {n} candidate{'' if n == 1 else 's'} compiled")
                continue
            best, results = autotune(g, args.batch, args.kv_len)
            for ch, us in sorted(results, key=lambda r: r[1])[:5]:
                print(f"@{g.name}: {ch.describe()}: {us:.1f} µs")
            print(f"@{g.name}: stored {best.describe()} for batch "
                  f"{args.batch}, KV {args.kv_len}")
        return 0
    return run
