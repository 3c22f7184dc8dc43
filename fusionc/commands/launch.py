"""``fusionc launch``: start one process per GPU with torchrun's environment variables."""
from __future__ import annotations

import argparse

from fusionc.cli import command
from fusionc.commands.compile import positive_int

_EPILOG = """\
Starts N copies of COMMAND, one per GPU, with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set as torchrun sets them (so scripts written for torchrun run unchanged), and with
NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1). Each line of output is prefixed with its rank. When a rank fails the
others are stopped; the exit status is the first failing rank's.

examples:
  fusionc launch -n 2 -- python3 -m fusionc run examples/tp2_llama_layer.py --batch 4
  fusionc launch -n 2 -- python3 benchmarks/tp2.py
  fusionc launch -n 2 -- python3 my_torchrun_script.py
"""


@command("launch", "start one process per GPU (tensor parallelism), like torchrun")
def setup(p):
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _EPILOG
    p.add_argument("-n", "--nproc", type=positive_int, default=2, help="processes (GPUs)")
    p.add_argument("--port", type=int, default=0, help="MASTER_PORT (default: a free port)")
    p.usage = "fusionc launch [-h] [-n NPROC] [--port PORT] -- COMMAND [ARGS...]"
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="the command to run on every rank (after --)")

    def run(args):
        from fusionc.comm.launcher import launch
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        return launch(cmd, args.nproc, args.port)
    return run
