#!/usr/bin/env bash
# One device call for the work that waited for a GPU (issues 22, 24, 25, 27): the GPU tests of the
# modules never run on one, each bounded, then the benchmarks asked for. Fill the cache first
# on a CPU machine (NVRTC needs no GPU) and carry .whl and .fcache.tgz:
#   FUSIONC_CACHE_DIR=.fcache python -m tests.gpu.precompile
#   FUSIONC_CACHE_DIR=.fcache python benchmarks/mla.py --compile-only   # and prefill.py, decode.py
#   tar czf .fcache.tgz .fcache
# then:  bash scripts/pending_session.sh tests [MODULE...]   (default: the pending modules)
#        bash scripts/pending_session.sh mla|prefill|decode [the benchmark's args...]
#        bash scripts/pending_session.sh timeline mla [the benchmark's args...]   (per kernel)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
what=${1:-tests}; shift || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case $what in
  tests)
    mods=${*:-test_mla_v2_gpu test_attention_v2_gpu test_step_ends_gpu test_prefill_gpu test_graphs_v2_gpu test_models_gpu}
    for m in $mods; do
      s=$SECONDS
      timeout "${SUITE_S:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
        "tests/gpu/$m.py" > "$out/$m.log" 2>&1
      echo "$m rc=$? $((SECONDS - s)) s: $(tail -1 "$out/$m.log")"
      grep -E "^(FAILED|ERROR)" "$out/$m.log" | cut -c1-220 | head -8
    done ;;
  mla|prefill|decode)
    OUT="$out" python3 "benchmarks/$what.py" "$@" > "$out/bench_$what.log" 2>&1
    echo "$what rc=$?"; grep -E "^\|" "$out/bench_$what.log" | tail -40 ;;
  timeline)
    python3 benchmarks/timeline.py "$@" > "$out/timeline.log" 2>&1
    echo "timeline rc=$?"; grep -vE "^(fusionc|Warning|  warn)" "$out/timeline.log" | tail -60 ;;
esac
