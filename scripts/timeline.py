"""Where the time of a fused kernel goes, op by op: compile a graph of an example with
CodegenOptions(timeline=True), launch it on random inputs with every KV row at full length,
and print each kernel's time stamps (fusionc.runtime.timeline). GPU only.

    python3 scripts/timeline.py examples/llama2_7b.py --graph mlp --batch 16
    python3 scripts/timeline.py examples/deepseek_v2_lite.py --batch 1 --kv-len 4096 \\
        --codegen load_batch=4
    python3 scripts/timeline.py ... --compile-only      # CPU: fill the cubin cache (no torch)
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]


def build(path: str, graph: str | None, batch: int, kv: int, codegen):
    """(graph, compiled module) of the timeline build; ``codegen``: CodegenOptions or None."""
    import dataclasses

    import fusionc as fc
    from fusionc.codegen import CodegenOptions
    from fusionc.commands.ir import load
    from fusionc.errors import DSLError
    from fusionc.dsl.loader import build_parameters
    sizes = {"max_seq": kv} if "max_seq" in build_parameters(path) else {}
    module = load(path, sizes)
    graphs = [g for g in module.graphs if g.kind == "graph" and graph in (None, g.name)]
    if not graphs:
        raise DSLError(f"no graph named '{graph}'", valid=", ".join(module.names))
    opts = dataclasses.replace(codegen or CodegenOptions(), timeline=True)
    return graphs[0], fc.compile(graphs[0], max_batch=batch, kv_len=kv, codegen=opts)


def run(g, fn, batch: int, kv: int, launches: int = 5) -> None:
    import numpy as np

    from fusionc.commands.compile import random_inputs
    from fusionc.runtime import timeline
    from fusionc.runtime.transfer import upload
    ins = random_inputs(g, batch, np.random.default_rng(0), max_len=kv)
    for name in ("seq_lens", "positions"):  # every row at full length
        if name in ins:
            ins[name] = np.full(batch, kv if name == "seq_lens" else kv - 1, np.int32)
    dev = {p.name: upload(ins[p.name], p.type.dtype) for p in g.params}
    for _ in range(launches):
        fn(**dev)
    for name, stamps in timeline.read(fn).items():
        print(f"@{g.name} {name}, batch {batch}, KV {kv}: {fn.report().splitlines()[0]}")
        print(timeline.table(stamps))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="an example DSL file")
    ap.add_argument("--graph", help="the graph (default: the first)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kv-len", type=int, default=4096, help="KV length (every row full)")
    from fusionc.commands.compile import codegen_options_arg
    ap.add_argument("--codegen", type=codegen_options_arg, metavar="K=V,...",
                    help="more CodegenOptions, e.g. load_batch=4,gemv_mma_batch=0")
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    from fusionc.errors import FusionError
    try:
        graph, compiled = build(a.source, a.graph, a.batch, a.kv_len, a.codegen)
    except FusionError as e:
        sys.exit(f"timeline: {e}")
    if a.compile_only:
        print(compiled.report())
    else:
        run(graph, compiled, a.batch, a.kv_len)
