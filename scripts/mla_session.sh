#!/usr/bin/env bash
# One call on the GPU machine (nvidia-h200): the MLA GPU tests, then benchmarks/mla.py.
# Compile first on a CPU machine and carry the cache:
#   FUSIONC_CACHE_DIR=.fcache15 python -c "from tests.gpu import test_mla_v2_gpu as t; t.precompile()"
#   FUSIONC_CACHE_DIR=.fcache15 python benchmarks/mla.py --compile-only [--sweep]
#   tar czf .fcache15.tgz .fcache15      # carry .whl and .fcache15.tgz
# then on the GPU machine:
#   tar xzf .fcache15.tgz && FUSIONC_CACHE_DIR=.fcache15 bash scripts/mla_session.sh [ARGS]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD FUSIONC_CACHE_DIR=$(realpath "${FUSIONC_CACHE_DIR:-.fcache}")
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import transformers, importlib.util as u; print('transformers', transformers.__version__, \
'deepseek_v2:', u.find_spec('transformers.models.deepseek_v2') is not None)"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_mla_v2_gpu.py 2>&1 | tail -15
python3 -m fusionc run examples/deepseek_v2_lite.py --batch 1 --kv-len 4096 2>&1 | tail -2
python3 benchmarks/mla.py "$@" 2>&1 | tail -60
