#!/usr/bin/env bash
# One device call for issue 20's figures: unpack the carried cubin cache (.fcache.tgz), run the
# GPU test suite (bounded), the GEMV sweep, the host-overhead table and `fusionc run --lowering
# v2`; short tables last. Fill the cache first on a CPU machine:
#   FUSIONC_CACHE_DIR=.fcache python -m tests.gpu.precompile && \
#   FUSIONC_CACHE_DIR=.fcache python benchmarks/gemv.py --compile-only && \
#   FUSIONC_CACHE_DIR=.fcache python benchmarks/host_overhead.py --compile-only && \
#   tar czf .fcache.tgz .fcache
# then run (carry .whl and .fcache.tgz):  bash scripts/v2_session.sh [suite seconds]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
timeout "${1:-330}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu \
  --ignore=tests/gpu/test_tp2_gpu.py > "$out/gpu_suite.log" 2>&1
echo "suite rc=$? $(tail -1 "$out/gpu_suite.log")"
grep -E "^(FAILED|ERROR)" "$out/gpu_suite.log" | head -20
OUT="$out" python3 benchmarks/gemv.py > "$out/gemv.log" 2>&1; echo "gemv rc=$?"
OUT="$out" timeout 120 python3 benchmarks/host_overhead.py > "$out/host.log" 2>&1
echo "host rc=$?"; grep "^|" "$out/host.log"
python3 -m fusionc run examples/linear_v2.py --lowering v2 --batch 4 -D k=4096 2>&1 | tail -4
grep "^|" "$out/gemv.log" | awk -F'|' '$4 ~ /^ (1|16) $/ {print}' | cut -c1-120
