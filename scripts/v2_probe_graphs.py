"""Probe the graphs of ``examples/graphs_v2.py`` on the GPU: time per call of each (CUDA graph
over buffers rotated past 3x L2, ``benchmarks.common.time_graph``), to split an MLP's time into
its parts (a lone linear, paired tiles without the norm, the norm prologue, the residual).

    python3 scripts/v2_probe_graphs.py [HIDDEN INTER DTYPE BATCH,... GRAPH,...]   # 4096 14336 f16 1,4,16
    FUSIONC_CACHE_DIR=.fcache python3 scripts/v2_probe_graphs.py --compile-only ...
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fusionc as fc  # noqa: E402
from fusionc.dsl.loader import load_file  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                       "graphs_v2.py")
GRAPHS = ("linear", "mlp_shard", "norm_silu", "swiglu", "mlp")


def build(hidden, inter, dt, b, graphs=GRAPHS):
    """{graph: (Graph, compiled fn)} of the example at these sizes; ``linear`` is [2·inter,
    hidden] (the gate/up weight without the norm or the pair)."""
    out = {}
    for g in graphs:
        i = 2 * inter if g in ("linear", "mlp_shard") else inter
        m = load_file(EXAMPLE, hidden=hidden, inter=i, dtype=dt)
        out[g] = (m[g], fc.compile(m, g, max_batch=b, lowering="v2"))
    return out


def main(argv) -> None:
    compile_only = "--compile-only" in argv
    argv = [a for a in argv if a != "--compile-only"]
    hidden, inter = (int(a) for a in (argv[:2] or (4096, 14336)))
    dt = argv[2] if len(argv) > 2 else "f16"
    batches = [int(b) for b in (argv[3] if len(argv) > 3 else "1,4,16").split(",")]
    graphs = argv[4].split(",") if len(argv) > 4 else GRAPHS
    if compile_only:
        for b in batches:
            build(hidden, inter, dt, b, graphs)
        return
    import torch
    from benchmarks.common import sets_needed, time_graph
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dt]
    print(f"| graph | batch | us |\n|---|---|---|")
    for b in batches:
        for name, (g, fn) in build(hidden, inter, dt, b, graphs).items():
            def one():
                d = {}
                for p in g.params:
                    shape = [b if isinstance(s, str) else s for s in p.type.shape]
                    d[p.name] = (torch.randn(*shape, device="cuda") / shape[-1] ** 0.5).to(tdt)
                return d
            nbytes = sum(p.type.numel({"B": b}) * 2 for p in g.params)
            sets = [one() for _ in range(sets_needed(nbytes))]
            us = time_graph([lambda s=s: fn(**s) for s in sets]) * 1e6
            print(f"| {name} | {b} | {us:.1f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
