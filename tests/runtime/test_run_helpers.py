"""Host-side pieces of the GPU runtime that need no GPU: dtype transfer bits, which outputs are
poisoned, symbolic dims from argument shapes."""
from __future__ import annotations

import numpy as np
import pytest

from fusionc.errors import InputError
from fusionc.interp.numerics import round_bf16
from fusionc.ir import DType, parse_module
from fusionc.runtime.run import bind_dims, pure_outputs
from fusionc.runtime.transfer import device_bits_to_host, host_to_device_bits, nan_bits
from tests.codegen.programs import attention_kernel
from tests.sim.programs import splitk_gemv


def test_bf16_travels_as_its_high_16_bits():
    x = np.array([1.0, -2.5, 3.14159, np.inf, np.nan, 1e-40], np.float32)
    b = host_to_device_bits(x, DType.bf16)
    assert b.dtype == np.uint16 and b[0] == 0x3F80 and b[1] == 0xC020
    back = device_bits_to_host(b, DType.bf16)
    np.testing.assert_array_equal(back, round_bf16(x))
    assert nan_bits(DType.bf16) == 0x7FC0 and np.isnan(nan_bits(DType.f16))


def test_f16_and_int_bits():
    assert host_to_device_bits(np.array([70000.0]), DType.f16)[0] == np.inf
    assert host_to_device_bits(np.array([3.0]), DType.i32).dtype == np.int32


def test_pure_outputs_exclude_read_and_appended_tensors():
    k = parse_module(attention_kernel()).graphs[0]
    assert pure_outputs(k) == ["y"]  # the caches are read and updated in place
    assert pure_outputs(parse_module(splitk_gemv(4, 2, 64, 16, "f16")).graphs[0]) == ["y"]


def test_bind_dims():
    k = parse_module(splitk_gemv(4, 2, 64, 16, "f16")).graphs[0]
    args = {"x": np.zeros((3, 256)), "w": np.zeros((32, 256)), "y": np.zeros((3, 32))}
    assert bind_dims(k, args) == {"B": 3}
    with pytest.raises(InputError, match="%y has shape"):
        bind_dims(k, {**args, "y": np.zeros((2, 32))})
    with pytest.raises(InputError, match="missing argument %w"):
        bind_dims(k, {"x": args["x"], "y": args["y"]})


def test_resident_kernels_checked_against_the_occupancy_query(monkeypatch):
    """At load, a kernel that needs its whole grid resident is refused when the driver's
    occupancy query (clusters, or CTAs per SM x SMs without clusters) holds fewer."""
    from types import SimpleNamespace

    real = pytest.importorskip("cuda.bindings.driver")
    from fusionc.errors import DeviceError
    from fusionc.runtime import launch
    ok = real.CUresult.CUDA_SUCCESS
    seen = {}

    class Fake:
        def __getattr__(self, name):
            return getattr(real, name)

        def cuOccupancyMaxActiveClusters(self, function, cfg):
            seen["cluster"] = cfg.attrs[0].value.clusterDim.x  # passed even with __cluster_dims__
            seen["attrs"] = cfg.numAttrs  # and no PDL attribute
            return ok, 60

        def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, function, threads, smem):
            seen["threads"] = threads
            return ok, 2

    monkeypatch.setattr(launch, "driver", lambda: Fake())
    monkeypatch.setattr(launch, "_sm_count", lambda: 132)
    src = SimpleNamespace(name="fusionc_k", grid=61, cluster=4, blocks=244, threads=256,
                          smem_bytes=1024, pdl=True, resident=True, cluster_dims_in_source=True,
                          persistent_units=0)
    with pytest.raises(DeviceError, match="needs its 61 clusters of 4 resident.*holds 60"):
        launch._check_occupancy(src, None)
    assert seen["cluster"] == 4 and seen["attrs"] == 1
    launch._check_occupancy(SimpleNamespace(**{**vars(src), "grid": 60, "blocks": 240}), None)
    one = SimpleNamespace(**{**vars(src), "grid": 265, "cluster": 1, "blocks": 265})
    with pytest.raises(DeviceError, match="holds 264"):
        launch._check_occupancy(one, None)
    assert seen["threads"] == 256
    monkeypatch.setattr(launch, "_sm_count", lambda: 114)  # an H100 PCIe: 2 x 114 CTAs
    with pytest.raises(DeviceError, match="needs its 240 clusters of 1 resident.*holds 228"):
        launch._check_occupancy(SimpleNamespace(**{**vars(one), "grid": 240}), None)
    launch._check_occupancy(SimpleNamespace(**{**vars(one), "grid": 228}), None)
    launch._check_occupancy(SimpleNamespace(**{**vars(one), "resident": False}), None)
