#!/usr/bin/env bash
# One call on the two-GPU machine (nvidia-h200-x2): the TP2 checks and/or the benchmark.
# Compile first on a CPU machine and carry the cache:
#   FUSIONC_CACHE_DIR=.fcache12 python scripts/tp2_check.py --compile-only
#   tar czf .fcache12.tgz .fcache12      # carry .whl and .fcache12.tgz
# then on the GPU machine:
#   tar xzf .fcache12.tgz && FUSIONC_CACHE_DIR=.fcache12 bash scripts/tp2_session.sh [smoke|tests|bench|overlap|all]
# NVLink multicast stays off (the variables below); fusionc's kernels use plain peer stores.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD FUSIONC_CACHE_DIR=$(realpath "${FUSIONC_CACHE_DIR:-.fcache}")
out=${OUT:-/tmp/out}; mkdir -p "$out"
what=${1:-all}; shift || true
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
nvidia-smi topo -m 2>&1 | head -4
launch() { timeout "${TP2_TIMEOUT:-600}" python3 -m fusionc launch -n 2 -- "$@"; }
if [[ $what == smoke ]]; then
  launch python3 scripts/tp2_check.py --out "$out/check" --quick "$@" 2>&1 | tail -40
  for r in 0 1; do python3 -c "import json,sys; d=json.load(open('$out/check/rank$r.json')); \
print('rank', $r, 'errors', len(d['errors'])); [print(e[-1500:]) for e in d['errors']]"; done
fi
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_tp2_gpu.py "$@" 2>&1 \
    | tee "$out/tp2_tests.log" | tail -30
  for ex in tp2_llama_layer tp2_mlp; do   # the CLI on two ranks
    launch python3 -m fusionc run examples/$ex.py --batch 4 --kv-len 1024 2>&1 | tail -2
  done
fi
if [[ $what == overlap || $what == all ]]; then   # issue 10: token-split overlap
  [[ $what == overlap ]] && launch python3 scripts/tp2_check.py --out "$out/split" --quick \
    --only split_tokens 2>&1 | tail -4
  for T in 1024 8192; do for p in 1 2; do   # the CLI at many tokens, split and unsplit
    launch python3 -m fusionc run examples/tp2_mlp.py --batch $T --split-tokens $p 2>&1 | tail -1
    launch python3 -m fusionc run examples/tp2_llama_layer.py --graph o_proj --batch $T \
      --split-tokens $p 2>&1 | tail -1
  done; done
  launch python3 benchmarks/tp2_overlap.py --json "$out/tp2_overlap.json" ${OVERLAP_ARGS:-} \
    2>&1 | tee "$out/tp2_overlap.log" | grep "rank 0" | tail -14
fi
if [[ $what == bench || $what == all || $what == smoke ]]; then
  launch python3 benchmarks/tp2.py --json "$out/tp2.json" ${BENCH_ARGS:-} 2>&1 \
    | tee "$out/tp2_bench.log" | grep "rank 0" | tail -14
fi
