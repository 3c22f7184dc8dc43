#!/usr/bin/env bash
# One device call: install the carried wheels, run the GPU tests, then benchmarks; a short
# table last. Compile cubins first on a CPU machine (they travel in .fcache):
#   FUSIONC_CACHE_DIR=.fcache python -m tests.gpu.precompile
#   FUSIONC_CACHE_DIR=.fcache python benchmarks/attention_block.py --compile-only
# then on the GPU machine (carry .whl and .fcache):
#   bash scripts/gpu_session.sh [tests|bench|bench-full|decode|gemv|all] [pytest, decode.py or
#   gemv.py args...]
# bench: batch 1, KV 4096, no torch.compile (minutes); bench-full: issue 8's tables (every
# point, torch.compile in the same run; ~4 min on an H200).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD FUSIONC_CACHE_DIR=$(realpath "${FUSIONC_CACHE_DIR:-.fcache}")
out=${OUT:-/tmp/out}; mkdir -p "$out"
what=${1:-all}; shift || true
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider "$@" 2>&1 | tee "$out/gpu_tests.log" | tail -60
fi
if [[ $what == bench || $what == all ]]; then
  python3 benchmarks/attention_block.py ${BENCH_ARGS:---quick --no-torch-compile} 2>&1 | tee "$out/bench_attention.log" | tail -8
  python3 benchmarks/mlp_block.py ${BENCH_ARGS:---quick --no-torch-compile} 2>&1 | tee "$out/bench_mlp.log" | tail -8
fi
if [[ $what == bench-full ]]; then
  python3 benchmarks/attention_block.py 2>&1 | tee "$out/bench_attention.log" | tail -20
  python3 benchmarks/mlp_block.py 2>&1 | tee "$out/bench_mlp.log" | tail -8
fi
if [[ $what == gemv ]]; then   # issue 20's GEMV table (CSV in $OUT/gemv*.csv); e.g. --quick
  OUT="$out" python3 benchmarks/gemv.py "$@" 2>&1 | tee "$out/bench_gemv.log" | tail -130
fi
if [[ $what == decode ]]; then
  python3 benchmarks/decode.py "$@" 2>&1 | tee "$out/bench_decode.log" | tail -30
fi
