#!/usr/bin/env bash
# One device call for issue 21's figures: unpack the carried cubin cache (.fcache.tgz), run the
# v2 graph and linear GPU tests, then the MLP benchmark (v2 unchained as alt_us, torch.compile in its
# default mode); short tables last. Fill the cache first on a CPU machine:
#   FUSIONC_CACHE_DIR=.fcache python -c "from tests.gpu import test_graphs_v2_gpu as a, \
#     test_linear_v2_gpu as b; a.precompile(); b.precompile()"
#   FUSIONC_CACHE_DIR=.fcache python benchmarks/mlp_block.py --compile-only --compare-unchained ARGS
#   tar czf .fcache.tgz .fcache
# then run (carry .whl and .fcache.tgz):  bash scripts/mlp_session.sh ARGS  (mlp_block.py args;
# ALT=--compare-wide puts 128-row tiles in alt_us instead)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
timeout "${TESTS_S:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider -rA \
  tests/gpu/test_graphs_v2_gpu.py tests/gpu/test_linear_v2_gpu.py > "$out/gpu_tests.log" 2>&1
echo "tests rc=$? $(tail -1 "$out/gpu_tests.log")"
grep -E "^(FAILED|ERROR)|Error|error" "$out/gpu_tests.log" | head -20
grep -E "graphs v2|linear v2" "$out/gpu_tests.log" | head -30
OUT="$out" timeout "${BENCH_S:-400}" python3 benchmarks/mlp_block.py ${ALT:---compare-unchained} "$@" \
  > "$out/mlp.log" 2>&1
echo "mlp rc=$?"; grep -E "^\||bandwidth|cannot" "$out/mlp.log" | cut -c1-160
