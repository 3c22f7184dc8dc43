"""``fusionc random-model``: write a tiny random Hugging Face model folder
(:func:`fusionc.models.random.write_random_model`) to try ``fusionc generate`` without a
checkpoint."""
from __future__ import annotations

import argparse

from fusionc.cli import command
from fusionc.commands.compile import positive_int

_EPILOG = """\
examples:
  fusionc random-model /tmp/tiny --kind qwen3
  fusionc generate --model /tmp/tiny --prompt-tokens 1,2,3 --max-new-tokens 8 --cpu
  fusionc random-model /tmp/tiny-l --kind llama --layers 4 --dtype float32
"""


@command("random-model", "write a tiny random model (config.json + safetensors) into a folder")
def setup(p):
    from fusionc.models.random import TINY
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _EPILOG
    p.add_argument("dir", metavar="DIR", help="output folder (created if needed)")
    p.add_argument("--kind", choices=sorted(TINY), default="qwen3", help="default qwen3")
    p.add_argument("--seed", type=int, default=0, help="weights' seed (default 0)")
    p.add_argument("--layers", type=positive_int, help="decoder layers (default 2)")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"),
                   help="storage dtype (default: float16 for llama, else bfloat16)")
    p.add_argument("--untied", action="store_true", help="a separate lm_head.weight")
    return run


def run(args) -> int:
    """Run ``fusionc random-model`` (see its help)."""
    from fusionc.models.random import write_random_model
    fields = {}
    if args.layers:
        fields["num_hidden_layers"] = args.layers
    if args.dtype:
        fields["torch_dtype"] = args.dtype
    if args.untied:
        fields["tie_word_embeddings"] = False
    tensors = write_random_model(args.dir, args.kind, seed=args.seed, **fields)
    n = sum(t.size for t in tensors.values())
    print(f"wrote a random {args.kind} model ({len(tensors)} tensors, {n} parameters) to "
          f"{args.dir}/")
    return 0
