"""The cubin cache's folder (XDG_CACHE_HOME via platformdirs, FUSIONC_CACHE_DIR first), its
least-recently-used size limit, and ``fusionc cache info`` / ``fusionc cache clear``."""
from __future__ import annotations

import os

import pytest

import fusionc.cli
from fusionc.errors import InputError
from fusionc.runtime import cache, cache_evict

SRC = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n'


def fake_entry(d, n: int, size: int, used: float) -> str:
    key = f"{n:064x}"
    (d / f"{key}.cubin").write_bytes(b"\0" * size)
    (d / f"{key}.json").write_text("{}")
    os.utime(d / f"{key}.cubin", (used, used))
    return key


def test_folder_follows_xdg_and_fusionc_cache_dir_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("FUSIONC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if os.name == "posix" and os.uname().sysname == "Linux":
        assert cache.cache_dir() == tmp_path / "xdg" / "fusionc"
    monkeypatch.setenv("FUSIONC_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("FUSIONC_CACHE_DIR", "off")
    assert cache.cache_dir() is None


def test_least_recently_used_go_first(tmp_path):
    keys = [fake_entry(tmp_path, n, 1000, 1000.0 + n) for n in range(5)]
    (tmp_path / "autotune.json").write_text("{}" * 5000)     # never an entry
    cache_evict.touch(tmp_path, keys[0])                      # now the most recent
    assert cache_evict.evict(tmp_path, limit=2 * 1002 + 10) == 3
    left = {e.key for e in cache_evict.entries(tmp_path)}
    assert left == {keys[0], keys[4]}
    assert (tmp_path / "autotune.json").exists()
    assert cache_evict.evict(tmp_path, limit=0, keep=keys[4]) == 1   # the new entry stays
    assert [e.key for e in cache_evict.entries(tmp_path)] == [keys[4]]


def test_limit_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("FUSIONC_CACHE_MAX_MB", raising=False)
    assert cache_evict.max_bytes() == cache_evict.DEFAULT_MAX_MB * 2**20
    monkeypatch.setenv("FUSIONC_CACHE_MAX_MB", "0")
    assert cache_evict.max_bytes() is None
    monkeypatch.setenv("FUSIONC_CACHE_MAX_MB", "1.5")
    assert cache_evict.max_bytes() == 3 * 2**19
    for bad in ("-1", "lots"):
        monkeypatch.setenv("FUSIONC_CACHE_MAX_MB", bad)
        with pytest.raises(InputError, match="FUSIONC_CACHE_MAX_MB"):
            cache_evict.max_bytes()


def test_compiles_evict_beyond_the_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSIONC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FUSIONC_CACHE_MAX_MB", "0.000001")   # room for nothing but the newest
    cache.compile_cached(SRC)
    cache.compile_cached(SRC.replace("2.0f", "3.0f"))
    (only,) = cache_evict.entries(tmp_path)
    assert only.key == cache.cache_key(SRC.replace("2.0f", "3.0f"))
    assert cache.compile_cached(SRC.replace("2.0f", "3.0f"))[1]   # still a hit


def test_cache_info_and_clear_commands(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FUSIONC_CACHE_DIR", str(tmp_path))
    for n in range(3):
        fake_entry(tmp_path, n, 2**20, 1000.0)
    (tmp_path / "autotune.json").write_text("{}")
    assert fusionc.cli.main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"folder: {tmp_path}/" in out and "3 cubin(s), 3.0 MB" in out and "limit:" in out
    assert fusionc.cli.main(["cache", "clear"]) == 0
    assert "removed 3 cached cubin(s)" in capsys.readouterr().out
    assert cache_evict.entries(tmp_path) == [] and (tmp_path / "autotune.json").exists()
    assert fusionc.cli.main(["cache", "clear", "--autotune"]) == 0
    assert not (tmp_path / "autotune.json").exists()
    monkeypatch.setenv("FUSIONC_CACHE_DIR", "off")
    assert fusionc.cli.main(["cache", "info"]) == 0
    assert "off" in capsys.readouterr().out
