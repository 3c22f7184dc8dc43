"""The NVRTC toolchain compiles Hopper cluster kernels to sm_90a cubins on a CPU-only machine."""

from __future__ import annotations

import concurrent.futures
import multiprocessing

import pytest

from fusionc.runtime.nvrtc import NVRTCError, compile_cubin, include_dirs, nvrtc_version

ELF_MAGIC = b"\x7fELF"

TRIVIAL = r"""
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""

# fp16 + bf16 headers together and the cooperative-groups cluster API.
CLUSTER_CG = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

extern "C" __global__ void __cluster_dims__(4, 1, 1)
cluster_sum(const __half* a, const __nv_bfloat16* b, float* out) {
    __shared__ float buf[128];
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = __half2float(a[i]) + __bfloat162float(b[i]);
    cluster.sync();
    float acc = 0.f;
    for (unsigned r = 0; r < cluster.num_blocks(); ++r) {
        float* peer = cluster.map_shared_rank(buf, (rank + r) % cluster.num_blocks());
        acc += peer[threadIdx.x];
    }
    cluster.sync();
    out[i] = acc;
}
"""

# Distributed shared memory through inline PTX only.
CLUSTER_PTX = r"""
__device__ __forceinline__ void cluster_barrier() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

extern "C" __global__ void __cluster_dims__(2, 1, 1) dsm_swap(float* out) {
    __shared__ float buf[128];
    buf[threadIdx.x] = float(blockIdx.x * blockDim.x + threadIdx.x);
    cluster_barrier();
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(&buf[threadIdx.x]));
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank ^ 1u));
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    cluster_barrier();  // the peer's shared memory must outlive our read
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
"""


def test_nvrtc_version_and_headers():
    assert nvrtc_version() >= (13, 0)
    assert len(include_dirs()) == 2


@pytest.mark.parametrize(
    "source, kernel",
    [(TRIVIAL, "scale"), (CLUSTER_CG, "cluster_sum"), (CLUSTER_PTX, "dsm_swap")],
    ids=["trivial", "cluster-cg-fp16-bf16", "cluster-inline-ptx"],
)
def test_compiles_to_sm90a_cubin(source, kernel):
    result = compile_cubin(source, name=f"{kernel}.cu")
    assert result.cubin[:4] == ELF_MAGIC
    assert "sm_90a" in result.log
    stats = result.kernels[kernel]
    assert stats.registers > 0
    assert stats.spills == 0
    assert result.registers[kernel] == stats.registers
    if kernel != "scale":
        assert result.smem[kernel] >= 128 * 4


def test_syntax_error_raises_with_log():
    bad = 'extern "C" __global__ void broken(float* x) { x[0] = undeclared_name; }'
    with pytest.raises(NVRTCError) as info:
        compile_cubin(bad, name="broken.cu")
    msg = str(info.value)
    assert 'broken.cu(1): error: identifier "undeclared_name" is undefined' in msg
    assert info.value.log and info.value.log in msg


def test_rejects_virtual_arch():
    with pytest.raises(NVRTCError, match="real GPU arch"):
        compile_cubin(TRIVIAL, arch="compute_90a")


def test_two_processes_compile_at_once():
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
        futures = [pool.submit(compile_cubin, src) for src in (CLUSTER_CG, CLUSTER_PTX)]
        results = [f.result(timeout=300) for f in futures]
    for r in results:
        assert r.cubin[:4] == ELF_MAGIC
