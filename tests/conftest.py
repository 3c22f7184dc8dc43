"""Shared pytest setup: skip `gpu` tests without an sm_90 GPU; hypothesis profiles.

Hypothesis profile `ci` (chosen when the CI environment variable is set) or `dev` otherwise;
override with `--hypothesis-profile=NAME`.
"""

from __future__ import annotations

import functools
import os

import pytest

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is a dev extra; tests that need it import it themselves
    settings = None

if settings is not None:
    settings.register_profile(
        "ci",
        deadline=None,
        max_examples=50,
        suppress_health_check=[HealthCheck.too_slow],
        print_blob=True,
    )
    settings.register_profile("dev", deadline=None, max_examples=25)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")


@functools.lru_cache(maxsize=1)
def gpu_skip_reason() -> str | None:
    """None when an sm_90 GPU is usable through CuPy, else why not (never raises)."""
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        if count == 0:
            return "no CUDA device"
        ccs = [cupy.cuda.Device(i).compute_capability for i in range(count)]
    except Exception as e:  # no cupy, no driver, driver too old, ...
        return f"no usable CUDA GPU ({type(e).__name__}: {e})"
    if "90" not in ccs:
        return f"needs an sm_90 GPU, found compute capability {', '.join(ccs)}"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = gpu_skip_reason()
    if reason is not None:
        marker = pytest.mark.skip(reason=reason)
        for item in gpu_items:
            item.add_marker(marker)
