"""Check fusionc's GPU Decoder against the CPU HostDecoder (the float64 interpreter) on the same random
weights, phase by phase with a device synchronization after each (run with
CUDA_LAUNCH_BLOCKING=1 to locate a fault), then through the captured CUDA graph:

    python3 scripts/check_decoder.py [--arch llama|qwen3] [--steps 8] [--batch 2]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fusionc.interp.numerics import relative_error  # noqa: E402
from fusionc.models import Decoder, HostDecoder, config_from_dict  # noqa: E402
from fusionc.models.weights import random_head, random_layer  # noqa: E402

SIZES = dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=3072, num_hidden_layers=4, vocab_size=32000,
             max_position_embeddings=4096)
ARCH = {"llama": dict(architectures=["LlamaForCausalLM"], torch_dtype="float16"),
        "qwen3": dict(architectures=["Qwen3ForCausalLM"], torch_dtype="bfloat16",
                      num_attention_heads=16, num_key_value_heads=4, head_dim=128)}


def compare(arch: str, dtype: str | None = None, batch: int = 1, steps: int = 8,
            phases: bool = True, log=print) -> float:
    """Worst per-step logits error of the GPU Decoder against HostDecoder(precise=True) on the
    same random weights; row b of the batch sits 3·b positions ahead of row 0."""
    import cupy
    cfg = config_from_dict(SIZES | ARCH[arch])
    dt = dtype or cfg.dtype
    layers = [random_layer(cfg, i, dt) for i in range(cfg.layers)]
    head = random_head(cfg, dt)
    gpu = Decoder(cfg, batch=batch, max_seq=128, dtype=dt)
    gpu.load(layers, head)
    cpu = HostDecoder(cfg, batch=batch, max_seq=128, dtype=dt, precise=True)
    cpu.load(layers, head)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, (steps, batch))
    offset = 3 * np.arange(batch)
    if phases:
        _phases(gpu, tokens[0], offset, cupy.cuda.runtime.deviceSynchronize, log)
    worst = 0.0
    for t in range(steps):
        got = gpu.step(tokens[t], t + offset).get()
        want = cpu.step(tokens[t], t + offset)
        err = max(relative_error(got[r], want[r]) for r in range(batch))
        worst = max(worst, err)
        log(f"step {t}: GPU vs interpreter {err:.2e}")
    return worst


def _phases(gpu, tokens, positions, sync, log) -> None:
    """Step 0 eagerly, phase by phase, with a device synchronization after each."""
    from fusionc.models.decoder import _out
    gpu.tokens.set(tokens.astype(np.int32))
    gpu.positions.set(positions.astype(np.int32))
    gpu.seq_lens.set((positions + 1).astype(np.int32))
    a, b = gpu.x
    gpu.embed_graph(embed=gpu.embed, tokens=gpu.tokens, outputs={_out(gpu.embed_graph): b})
    sync()
    log("embedding ok")
    for i, w in enumerate(gpu.layers):
        gpu.attention(x=b, **{n: w[n] for n in gpu.attention.params if n in w},
                      positions=gpu.positions, seq_lens=gpu.seq_lens,
                      outputs={gpu.attention.host.outputs[0].name: a})
        sync()
        gpu.mlp(x=a, **{n: w[n] for n in gpu.mlp.params if n in w and n != "x"},
                outputs={gpu.mlp.host.outputs[0].name: b})
        sync()
        log(f"layer {i} ok")
    gpu.head_graph(x=b, final_norm=gpu.final_norm, lm_head=gpu.lm_head,
                   outputs={_out(gpu.head_graph): gpu.logits})
    sync()
    log("final norm and LM head ok")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=list(ARCH), default="llama")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", choices=("f16", "bf16"), help="override the config's dtype")
    args = ap.parse_args()
    worst = compare(args.arch, args.dtype, args.batch, args.steps,
                    log=lambda m: print(m, flush=True))
    print(f"{args.arch}: worst {worst:.2e} ({'ok' if worst <= 1e-2 else 'FAIL'})")
    return 0 if worst <= 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
