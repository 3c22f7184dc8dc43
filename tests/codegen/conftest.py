"""Code generation tests compile with a private, empty cubin cache (NVRTC really runs)."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cubin_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("FUSIONC_CACHE_DIR", str(tmp_path_factory.mktemp("cubins")))
    yield
    mp.undo()
