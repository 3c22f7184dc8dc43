"""The cubin cache: keyed without a GPU, atomic, safe under concurrent compiles, self-healing."""
from __future__ import annotations

import multiprocessing as mp

import pytest

from fusionc.runtime import cache

SRC = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n'


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSIONC_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_hit_after_miss(tmp_cache):
    r1, hit1 = cache.compile_cached(SRC)
    r2, hit2 = cache.compile_cached(SRC)
    assert (hit1, hit2) == (False, True)
    assert r1.cubin == r2.cubin and r2.cubin[:4] == b"\x7fELF"
    assert r2.kernels == r1.kernels


def test_key_depends_on_source_arch_and_options():
    k = cache.cache_key(SRC, "sm_90a", ())
    assert k != cache.cache_key(SRC + " ", "sm_90a", ())
    assert k != cache.cache_key(SRC, "sm_90", ())
    assert k != cache.cache_key(SRC, "sm_90a", ("-O3",))
    assert k == cache.cache_key(SRC, "sm_90a", ())


def test_corrupted_entry_is_rebuilt(tmp_cache):
    r1, _ = cache.compile_cached(SRC)
    (cubin,) = tmp_cache.glob("*.cubin")
    cubin.write_bytes(cubin.read_bytes()[:100])  # torn write
    r2, hit = cache.compile_cached(SRC)
    assert not hit and r2.cubin == r1.cubin
    (meta,) = tmp_cache.glob("*.json")
    meta.write_text("{not json")
    assert cache.compile_cached(SRC)[1] is False


def _compile(_):
    r, _hit = cache.compile_cached(SRC)
    return r.cubin


def test_concurrent_compiles_into_empty_cache(tmp_cache):
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        cubins = pool.map(_compile, range(8))
    assert len(set(cubins)) == 1 and cubins[0][:4] == b"\x7fELF"
    assert not list(tmp_cache.glob("*.tmp"))
    assert cache.compile_cached(SRC)[1] is True


@pytest.mark.parametrize("field, value", [("log", 5), ("log", None), ("log", ["x"]),
                                          ("options", 5), ("options", "-O3"), ("options", [1]),
                                          ("options", {"a": 1})])
def test_entry_with_fields_of_the_wrong_type_is_a_miss(tmp_cache, field, value):
    import json
    r1, _ = cache.compile_cached(SRC)
    (meta,) = tmp_cache.glob("*.json")
    data = json.loads(meta.read_text())
    meta.write_text(json.dumps({**data, field: value}))
    r2, hit = cache.compile_cached(SRC)
    assert not hit and r2.cubin == r1.cubin and r2.kernels == r1.kernels
    assert cache.compile_cached(SRC)[1] is True   # rewritten


def test_the_log_is_covered_by_the_checksum(tmp_cache):
    import json
    r1, _ = cache.compile_cached(SRC)
    (meta,) = tmp_cache.glob("*.json")
    data = json.loads(meta.read_text())
    meta.write_text(json.dumps({**data, "log": data["log"] + "\nptxas info    : Used 1 registers"}))
    r2, hit = cache.compile_cached(SRC)
    assert not hit and "Used 1 registers" not in r2.log and r2.kernels == r1.kernels
