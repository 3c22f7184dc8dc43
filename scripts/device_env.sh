# Sourced by the one-call device scripts: unpack the carried cubin cache (.fcache.tgz), install
# the carried wheels (.whl), keep NVLink multicast off, and set $out (results, default /tmp/out).
[[ -f .fcache.tgz ]] && tar xzf .fcache.tgz
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD FUSIONC_CACHE_DIR=$(realpath .fcache)
out=${OUT:-/tmp/out}; mkdir -p "$out"
