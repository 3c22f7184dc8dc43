"""``fusionc generate``: decode a Hugging Face Llama-family model with fusionc's fused kernels."""
from __future__ import annotations

import argparse

from fusionc.cli import command
from fusionc.commands.compile import positive_int
from fusionc.errors import InputError

_EPILOG = """\
The prompt runs in chunks of up to 256 tokens (on the GPU: cuBLAS GEMMs and library attention
kernels; with --cpu: the interpreter). Then --max-new-tokens tokens are
generated (greedy unless --temperature > 0). Every layer's attention block is three persistent
kernels (QKV, the attention units, O) and its MLP block one or two; one decode step is one
CUDA graph. --tp N --cpu runs N simulated tensor-parallel ranks
(Llama-family models), each reading its shard of the checkpoint. Prints the tokens of each
sequence and ms per token.

examples:
  fusionc generate --model ./Llama-3.1-8B --prompt-tokens 128000,791,6864 --max-new-tokens 64
  fusionc random-model /tmp/tiny --kind qwen3                             # a tiny random model
  fusionc generate --model /tmp/tiny --prompt-tokens 1,2,3 --cpu         # interpreter, no GPU
  fusionc random-model /tmp/tiny-l --kind llama
  fusionc generate --model /tmp/tiny-l --prompt-tokens 1,2,3 --max-new-tokens 8 --cpu --tp 2
"""


def token_list(text: str) -> list[int]:
    """``"1,2,3"`` → [1, 2, 3] (argparse type)."""
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of token "
                                         "ids") from None
    if not out:
        raise argparse.ArgumentTypeError("the prompt needs at least one token id")
    return out


@command("generate", "decode a Hugging Face Llama/Qwen3 model (safetensors) on the GPU, or "
                     "a Llama/Qwen2/Qwen2.5/Qwen3 model in the interpreter with --cpu")
def setup(p):
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _EPILOG
    p.add_argument("--model", required=True, metavar="DIR",
                   help="folder with config.json and *.safetensors")
    p.add_argument("--prompt-tokens", required=True, type=token_list, metavar="IDS",
                   help="comma-separated prompt token ids")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="default 64")
    p.add_argument("--batch", type=positive_int, default=1,
                   help="sequences decoded together (each gets the prompt), default 1")
    p.add_argument("--max-seq", type=positive_int, help="KV cache capacity (default: prompt + "
                   "new tokens rounded up to 256)")
    p.add_argument("--dtype", choices=("f16", "bf16"), help="override the model's dtype")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, default 1")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--tp", type=positive_int, default=1,
                   help="tensor-parallel ranks: with --cpu, simulated ranks that each load "
                        "their shard of the checkpoint (on GPUs only 1 so far)")
    p.add_argument("--autotune", action="store_true", help="search kernel choices on the GPU")
    p.add_argument("--cpu", action="store_true",
                   help="run the graphs in the interpreter on the CPU (slow; no GPU needed)")
    return run


def run(args) -> int:
    """Run ``fusionc generate`` (see its help)."""
    from tqdm import tqdm

    from fusionc.models import Decoder, HostDecoder, Sampling, generate
    if args.tp != 1 and not args.cpu:
        raise InputError(f"--tp {args.tp} on GPUs",
                         valid="--tp 1, or --tp N --cpu (simulated ranks): the TP layer and "
                               "its collectives run on GPUs (fusionc launch -n 2 -- python3 -m "
                               "fusionc run examples/tp2_llama_layer.py), but the GPU decoder "
                               "does not shard over ranks yet")
    from fusionc.models import load_config
    sampling = Sampling(args.temperature, args.top_p, args.seed)
    cfg = load_config(args.model)
    total = len(args.prompt_tokens) + args.max_new_tokens - 1   # tokens the KV cache holds
    if total > cfg.max_position:
        raise InputError(f"{len(args.prompt_tokens)} prompt + {args.max_new_tokens} new tokens",
                         valid=f"at most max_position_embeddings + 1 = {cfg.max_position + 1} "
                               "in all")
    max_seq = args.max_seq or min(-(-total // 256) * 256, cfg.max_position)
    if total > max_seq:   # before compiling and loading anything
        raise InputError(f"--max-seq {max_seq} for {len(args.prompt_tokens)} prompt + "
                         f"{args.max_new_tokens} new tokens", valid=f"--max-seq >= {total}")
    if not args.cpu:
        from fusionc.models.decoder import check_gpu_support
        from fusionc.runtime.arrays import require_gpu
        check_gpu_support(cfg)   # before the GPU check: a model the kernels cannot run yet
        require_gpu()
    cls = HostDecoder if args.cpu else Decoder
    with tqdm(desc="compiling kernels", unit="kernel", disable=args.cpu) as bar:
        def progress(msg):
            bar.set_postfix_str(msg)
            bar.update()
        kw = dict(tp=args.tp) if args.cpu else {}
        dec = cls.from_pretrained(args.model, batch=args.batch, max_seq=max_seq,
                                  dtype=args.dtype, autotune=args.autotune,
                                  progress=None if args.cpu else progress, **kw)
    gen = generate(dec, args.prompt_tokens, args.max_new_tokens, sampling)
    for row in gen.tokens:
        print(",".join(str(int(t)) for t in row))
    where = ("CPU interpreter" + (f", {args.tp} simulated ranks" if args.tp > 1 else "")
             if args.cpu else "GPU")
    print(f"{len(args.prompt_tokens)} prompt tokens in {gen.prompt_ms:.1f} ms; "
          f"{gen.ms_per_token:.3f} ms/token ({where}, batch {args.batch})")
    return 0
