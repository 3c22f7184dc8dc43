"""Compile every kernel of the GPU tests into the cubin cache (no GPU needed).

    FUSIONC_CACHE_DIR=.fcache python -m tests.gpu.precompile

The GPU machine then runs ``FUSIONC_CACHE_DIR=.fcache python -m pytest -m gpu tests/gpu`` and
only loads cubins (the cache key includes the NVRTC version: a different NVRTC recompiles).
"""
from __future__ import annotations

import concurrent.futures
import time

from fusionc.codegen import CodegenOptions, compile_kernel
from fusionc.ir import parse_module
from tests.gpu import (common, test_attention_gpu, test_attention_v2_edges_gpu,
                       test_attention_v2_gpu, test_collectives_gpu,
                       test_gemv_gpu, test_graph_ops_gpu, test_graphs_v2_gpu,
                       test_grid_gpu,
                       test_linear_v2_gpu,
                       test_mla_v2_gpu,
                       test_models_gpu, test_prefill_gpu, test_step_ends_gpu,
                       test_zz_negative_control_gpu)


def _compile(item):
    text, verify, options = item
    k = text if verify is None else parse_module(text, verify=verify).graphs[0]
    ck = compile_kernel(k, CodegenOptions(**options))
    return ck.report(), ck.spills, ck.cached


def main() -> int:
    from tests.gpu import compiled_cases
    t0 = time.time()
    compiled_cases.precompile()  # fusionc.compile of every end-to-end case (through the cache)
    test_models_gpu.precompile()
    test_mla_v2_gpu.precompile()
    test_linear_v2_gpu.precompile()
    test_graphs_v2_gpu.precompile()
    test_attention_v2_gpu.precompile()
    test_attention_v2_edges_gpu.precompile()
    test_step_ends_gpu.precompile()
    test_prefill_gpu.precompile()
    from fusionc.runtime import row_kernels
    from fusionc.runtime.cache import compile_cached
    compile_cached(row_kernels.source(), name="row_kernels.cu")   # the library path's kernels
    print(f"end-to-end cases and model decoders compiled in {time.time() - t0:.1f} s")
    for mod in (test_collectives_gpu, test_gemv_gpu, test_attention_gpu, test_grid_gpu,
                test_graph_ops_gpu, test_zz_negative_control_gpu):
        mod.precompile()
    items = []  # unique (text or kernel, verify, options), in order
    for t, v, o in common.PRECOMPILE:
        item = (t, v, tuple(sorted(o.items())))
        if item not in items:
            items.append(item)
    t0 = time.time()
    with concurrent.futures.ProcessPoolExecutor() as pool:
        results = list(pool.map(_compile, [(t, v, dict(o)) for t, v, o in items]))
    spills = [r for r, s, _ in results if s]
    print(f"{len(results)} kernels ({sum(c for *_, c in results)} cached) in "
          f"{time.time() - t0:.1f} s; {len(spills)} with spills")
    for r in spills:
        print("  spills:", r)
    return 1 if spills else 0


if __name__ == "__main__":
    raise SystemExit(main())
