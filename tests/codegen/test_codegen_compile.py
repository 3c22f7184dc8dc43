"""Every tile program of tests/sim (and tests/codegen/programs.py) generates CUDA that NVRTC
compiles to an sm_90a cubin without spills. NVRTC takes ~0.1-1 s per kernel: configurations are
sampled, not enumerated (the GPU tests cover every cluster size with every collective)."""
from __future__ import annotations

import re

import pytest

from fusionc.codegen import CodegenOptions, compile_kernel, generate_cuda
from fusionc.ir import parse_module
from tests.codegen import programs as P
from tests.sim.programs import collective_kernel, splitk_gemv

ELF = b"\x7fELF"


def compiled(text: str, verify: bool = True, **opts):
    k = parse_module(text, verify=verify).graphs[0]
    ck = compile_kernel(k, CodegenOptions(**opts))
    assert ck.cubin[:4] == ELF
    assert ck.spills == 0, ck.report()
    assert ck.registers > 0
    return ck


COLLECTIVES = [  # (kind, cluster, shape, dtype, axis): every size, each kind, several payloads
    ("sum", 1, (7,), "f32", 0), ("max", 2, (4, 33), "f16", 0), ("gather", 4, (2, 5), "bf16", 1),
    ("sum", 8, (2, 3, 8), "bf16", 0), ("gather", 16, (3,), "f32", 0),
    ("max", 16, (256,), "f32", 0), ("sum", 4, (1024,), "f16", 0), ("gather", 8, (2, 64), "f16", 0),
]


@pytest.mark.parametrize("kind,size,shape,dtype,axis", COLLECTIVES)
def test_collective_kernels_compile(kind, size, shape, dtype, axis):
    ck = compiled(collective_kernel(kind, size, 2, shape, dtype, axis=axis))
    src = ck.source
    assert src.cluster == size and src.blocks == 2 * size
    assert ("__cluster_dims__" in src.source) == (1 < size <= 8)
    if size > 1:
        assert "mapa.shared::cluster" in src.source and "fc_cluster_sync();" in src.source


def test_reversed_butterfly_masks_compile():
    compiled(collective_kernel("sum", 8, 1, (5,), "f32", masks=(4, 2, 1)))


@pytest.mark.parametrize("scheme", ["splitk", "gather"])
@pytest.mark.parametrize("size,dtype", [(4, "f16"), (16, "bf16"), (2, "f32")])
def test_splitk_gemv_compiles(scheme, size, dtype):
    text = splitk_gemv(size, 2, 64, 32, dtype, scheme=scheme)  # max_batch 8: tensor cores
    src = compiled(text).source.source
    # <threads, K, rows, U, NB, pipe, ...>: 2 CTAs/SM, one block of 8 k-steps, no prefetch
    assert (re.search(r"fc_gemv_mma<FC_THREADS, \d+, \d+, 8, 1, false,", src) is not None) == \
        (dtype != "f32")
    assert ("// 16-byte weight vectors;" in src) == (dtype == "f32")
    src = compiled(text, gemv_mma_batch=0).source.source
    assert "// 16-byte weight vectors;" in src and "fc_gemv_mma<" not in src


@pytest.mark.parametrize("batch,bucket,path", [
    ("B", 2, "fma"), ("B", 4, "mma, 1 n-tile"), ("B", 16, "mma, 2 n-tiles"),
    ("3", 8, "fma"), ("24", 8, "mma, 2 n-tiles")])
def test_gemv_tensor_cores_from_four_rows(batch, bucket, path):
    text = splitk_gemv(4, 2, 64, 32, "bf16", batch=batch).replace(
        "max_batch = 8", f"max_batch = {bucket}")
    src = compiled(text).source.source
    assert ("fc_gemv_mma<" in src) == path.startswith("mma")
    if path.startswith("mma"):
        assert f"fc_gemv_mma<FC_THREADS, 64, 32, 8, {path[5]}, false, false, true>" in src
        src = compiled(text, gemv_mma_pipeline=2).source.source  # pipelined: 2 blocks of 4
        assert f"fc_gemv_mma<FC_THREADS, 64, 32, 4, {path[5]}, true, false, true>" in src


@pytest.mark.parametrize("option,blocks,steps,pipe", [
    (1, 1, 4, "true"), (1, 2, 8, "false"), (0, 1, 8, "false"), (2, 2, 4, "true")])
def test_gemv_mma_pipelined_at_one_cta_per_sm(option, blocks, steps, pipe):
    from fusionc.codegen.ops_compute import mma_plan
    from fusionc.ir import DType
    from types import SimpleNamespace as NS
    t = NS(dtype=DType.bf16, itemsize=2)
    got = mma_plan(t, t, dict(vec=True), 16, CodegenOptions(gemv_mma_pipeline=option), blocks)
    assert got == dict(U=steps, NB=2, pipe=pipe)


@pytest.mark.parametrize("k", [200, 203])
def test_masked_gemv_paths(k):
    src = compiled(P.masked_gemv(4, 3, 64, 16, k, 40, "f16")).source.source
    assert ("fc_gemv_mma<" in src) == (k % 8 == 0)  # tensor cores need 16-byte vectors
    assert ("// scalar weight loads" in src) == (k % 8 != 0)


@pytest.mark.slow   # NVRTC of whole attention blocks
@pytest.mark.parametrize("kw", [dict(), dict(head_dim=64, group=4, dtype="bf16", cluster=2),
                                dict(head_dim=72, dtype="f32", group=8, cluster=16),
                                dict(head_dim=256, group=1, cluster=8)])
def test_attention_kernel_compiles_without_spills(kw):
    ck = compiled(P.attention_kernel(**kw))
    assert "cp.async.cg.shared.global" in ck.source.source


@pytest.mark.slow   # NVRTC of whole attention blocks
@pytest.mark.parametrize("kw,opts,stream", [
    (dict(), {}, True), (dict(head_dim=72, dtype="f32"), {}, False),
    (dict(head_dim=256, dtype="f32"), {}, False), (dict(group=16), {}, False),
    (dict(group=8, dtype="bf16"), {}, False), (dict(group=8, dtype="f32"), {}, True),
    (dict(group=4, dtype="bf16", threads=256), {}, True),
    (dict(group=8, dtype="f32", threads=256), {}, True), (dict(), dict(attn_stream=0), False),
    (dict(group=7, dtype="f32", threads=256), {}, True)])
def test_attention_streamed_or_staged(kw, opts, stream):
    """The streamed path where its registers fit (no spills at 256 threads, two CTAs per SM),
    the staged one elsewhere."""
    kw = dict(kw)
    threads = kw.pop("threads", None)
    text = P.attention_kernel(**kw)
    if threads:
        text = text.replace("threads = 128", f"threads = {threads}")
        assert f"threads = {threads}" in text
    src = compiled(text, **opts).source.source
    assert ("fc_attn_partial_stream<FC_THREADS" in src) == stream
    assert ("fc_attn_partial<FC_THREADS" in src) == (not stream)
    g = kw.get("group", 2)  # prefetching below 4 query heads per KV head; tokens per block
    # (stream_tokens): 4 at two CTAs per SM, 2 from G = 7
    tokens = 2 if g >= 7 else 4
    if stream:
        assert f"{kw.get('head_dim', 128)}, {tokens}, {str(g < 4).lower()}>(" in src
        if threads:
            assert "__launch_bounds__(256, 2)" in src


def test_attention_tokens_per_block_option():
    src = compiled(P.attention_kernel(group=4), attn_tokens=8).source.source
    assert "fc_attn_partial_stream<FC_THREADS, 4, 128, 8, false>(" in src


def test_grid_reduce_kernels_compile():
    ck = compiled(P.grid_sum(4, 3, 100), grid_reduce_parallel=0)
    assert [p.kind for p in ck.source.params][-2:] == ["workspace", "counters"]
    assert ck.source.workspace_floats == 12 * 100 and ck.source.counters == 1
    assert not ck.source.resident
    ck = compiled(P.oproj_kernel(4, 3, 64, 64), grid_reduce_parallel=0)
    assert ck.source.counters == 4  # one window per rank
    ck = compiled(P.oproj_kernel(4, 3, 64, 64))  # 3 clusters of 4: resident, parallel sums
    assert ck.source.counters == 2 and ck.source.resident  # one grid barrier
    assert "fc_grid_sync_thread0(fc_counters + 0, fc_counters + 0 + 1, 12u" in ck.source.source
    # small shared memory: two CTAs per SM (__launch_bounds__(128, 2)), so twice the
    # one-CTA-per-SM placement (30 clusters of 4) is resident; 61 clusters may not be
    ck = compiled(P.oproj_kernel(4, 31, 64, 64))
    assert "__launch_bounds__(128, 2)" in ck.source.source
    assert ck.source.counters == 2 and ck.source.resident
    ck = compiled(P.oproj_kernel(4, 61, 64, 64))
    assert ck.source.counters == 4 and not ck.source.resident  # one window per rank


@pytest.mark.parametrize("heads,block", [(2, True), (8, False)])
def test_rms_norm_by_cta_or_by_warp(heads, block):
    """max_batch 4 x heads rows over 4 warps: the whole CTA per row up to 8 rows."""
    src = compiled(P.graph_ops_kernel(heads=heads), verify=False).source.source
    assert ("float* const fc_red" in src) == block  # the CTA's warp sums
    assert ("row += FC_THREADS / 32" in src) == (not block)


def test_graph_ops_in_a_kernel_compile():
    # graph ops are not yet allowed in kernels by the registry: bypass the verifier
    for style in ("neox", "gptj"):
        compiled(P.graph_ops_kernel(style=style), verify=False)


def test_debug_delay_build():
    ck = compiled(collective_kernel("sum", 4, 1, (8,), "f32"), delay=True)
    assert [p.kind for p in ck.source.params][-2:] == ["delay_rank", "delay_ns"]
    assert ck.source.source.count("fc_debug_delay(fc_rank") == 2  # smem_store, collective


def test_generated_source_is_deterministic_and_readable():
    text = splitk_gemv(4, 2, 64, 16, "f16")
    k = parse_module(text).graphs[0]
    a, b = generate_cuda(k).source, generate_cuda(parse_module(text).graphs[0]).source
    assert a == b
    assert "// [op 1, ir 3:8] %p = gemv(%xt, %w)" in a
    assert "// ===== stage 2: cluster_reduce, cluster barrier =====" in a


def test_smem_required_counts_tiles_and_matches_the_launch():
    from fusionc.codegen import smem_required
    k = parse_module(splitk_gemv(4, 2, 64, 16, "f16")).graphs[0]
    # xt f16[8, 64] (1 KB, ops 0-1) + p f32[8, 16] (512 B, ops 1-3); then buf (ops 2-5: freed
    # at the cluster barrier after the reduce) and s: live ranges packed
    assert smem_required(k) == generate_cuda(k).smem_bytes == 1536


def test_every_inline_asm_is_volatile():
    """A non-volatile asm is a pure function to the compiler, which may then run a load ahead of
    the bounds check that guards it (an out-of-bounds weight read compute-sanitizer found)."""
    import re
    src = generate_cuda(parse_module(splitk_gemv(4, 2, 64, 32, "f16")).graphs[0]).source
    assert "asm volatile(" in src
    assert not re.search(r"\basm\s*\(", src)


def test_pdl_prologue_compiles_and_is_off_by_default():
    """Programmatic dependent launch: first weight rows prefetched into L2, then the wait —
    before the kernel touches anything the predecessor may write —, the successor trigger
    after the body."""
    k = parse_module(splitk_gemv(4, 2, 64, 32, "f16")).graphs[0]
    assert "griddepcontrol" not in generate_cuda(k).source
    ck = compile_kernel(k, CodegenOptions(pdl=True))
    src = ck.source.source
    pre, wait, launch = (src.index(s) for s in ("prefetch.global.L2", "griddepcontrol.wait",
                                                 "griddepcontrol.launch_dependents"))
    assert pre < wait < src.index("fc_smem +") < launch and ck.source.pdl


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_batched_tile_loads_compile(dtype):
    """CodegenOptions(load_batch=4) issues four 16-byte loads before storing them (default: one
    per iteration); both compile without spills and differ only in the load loops."""
    k = parse_module(splitk_gemv(4, 2, 64, 32, dtype)).graphs[0]
    one, four = compile_kernel(k), compile_kernel(k, CodegenOptions(load_batch=4))
    assert four.spills == 0 and "// 4 loads in flight" in four.source.source
    assert "// 4 loads in flight" not in one.source.source


@pytest.mark.parametrize("g,blocks,threads,tokens", [
    (1, 1, 256, 8), (4, 1, 256, 8), (4, 1, 512, 4), (1, 2, 256, 4), (4, 2, 256, 4),
    (1, 2, 128, 4), (6, 2, 256, 4), (7, 2, 256, 2), (8, 2, 256, 2)])
def test_streamed_attention_tokens_by_occupancy(g, blocks, threads, tokens):
    """8 tokens only at one CTA of at most 256 threads per SM; 2 from G = 7 (f32 caches)."""
    from fusionc.codegen.ops_attention import stream_tokens
    assert stream_tokens(g, blocks, threads) == tokens
