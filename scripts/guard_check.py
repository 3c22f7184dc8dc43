"""Out-of-bounds write check for the layer kernels of a model config: every argument lives
inside a larger buffer whose guard bytes (4 KiB each side, 0x7E) must survive; each graph is
launched several times and compared with the float64 interpreter each time.

    python3 scripts/guard_check.py [--arch llama|qwen3] [--batch 1] [--max-seq 128]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_decoder import ARCH, SIZES  # noqa: E402

GUARD = 4096


def guarded(host_bits: np.ndarray):
    """(view, whole): a CuPy array holding ``host_bits`` inside a guard-padded buffer."""
    import cupy
    n = host_bits.nbytes
    whole = cupy.full(n + 2 * GUARD, 0x7E, cupy.uint8)
    view = whole[GUARD:GUARD + n].view(host_bits.dtype).reshape(host_bits.shape)
    view.set(host_bits)
    return view, whole


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=list(ARCH), default="qwen3")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--max-seq", type=int, default=128)
    args = ap.parse_args()
    import cupy
    import fusionc
    from fusionc.commands.compile import random_inputs
    from fusionc.interp import interpret
    from fusionc.interp.numerics import defined_relative_error
    from fusionc.models import config_from_dict
    from fusionc.models.blocks import layer_module
    from fusionc.runtime.transfer import download, host_to_device_bits
    cfg = config_from_dict(SIZES | ARCH[args.arch])
    mod = layer_module(cfg, args.max_seq)
    bad = 0
    for name in ("attention", "mlp"):
        g = mod[name]
        fn = fusionc.compile(mod, name, max_batch=args.batch, kv_len=max(1, args.max_seq // 2))
        print(fn.report(), flush=True)
        for rep in range(3):
            inputs = random_inputs(g, args.batch, np.random.default_rng(rep), max_len=args.max_seq)
            ref = interpret(g, inputs, precise=True)
            bufs = {p.name: guarded(host_to_device_bits(inputs[p.name], p.type.dtype))
                    for p in g.params}
            outs = {v.name: guarded(np.zeros(v.type.concrete({"B": args.batch}),
                                             host_to_device_bits(np.zeros(1), v.type.dtype).dtype))
                    for v in g.outputs if v.name not in bufs and "." not in v.name}
            got = fn(**{k: v[0] for k, v in bufs.items()},
                     outputs={k: v[0] for k, v in outs.items()})
            cupy.cuda.runtime.deviceSynchronize()
            for k, (_, whole) in (bufs | outs).items():
                h = whole.get()
                if (h[:GUARD] != 0x7E).any() or (h[-GUARD:] != 0x7E).any():
                    print(f"  @{name} rep {rep}: guard of '{k}' overwritten "
                          f"(before: {(h[:GUARD] != 0x7E).sum()} B, after: "
                          f"{(h[-GUARD:] != 0x7E).sum()} B)", flush=True)
                    bad += 1
            errs = [defined_relative_error(download(o, v.type.dtype), r)
                    for o, v, r in zip(got, g.outputs, ref)]
            print(f"  @{name} rep {rep}: errors " + ", ".join(f"{e:.1e}" for e in errs),
                  flush=True)
            bad += sum(e > 1e-2 for e in errs)
    print("guard check", "FAILED" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
