"""Shared-memory layout (fusionc.codegen.layout): live ranges of tiles and of DSM buffers."""
from __future__ import annotations

from fusionc.codegen import emitters
from fusionc.codegen.layout import plan_smem
from fusionc.ir import parse_module
from tests.sim.programs import splitk_gemv

_IN_REGION = """kernel @k {grid = 1, cluster = 2, max_batch = 1} (%x: f32[64], %y: f32[64]) {
  %t = load(%x) {offsets = ["0"], sizes = [64]} : f32[64]
  %buf = smem_alloc() : f32[64]
  smem_store(%buf, %t)
  cluster_barrier()
  when() {on = cluster, lo = 0, hi = 1} ({
    %s = cluster_reduce(%buf) {op = sum} : f32[64]
    store(%y, %s) {offsets = ["0"]}
  })
  cluster_barrier()
  %u = load(%x) {offsets = ["0"], sizes = [64]} : f32[64]
  store(%y, %u) {offsets = ["0"]}
  return %y
}
"""


def _plan(text, verify=True):
    k = parse_module(text, verify=verify).graphs[0]
    plan = plan_smem(k, lambda op: emitters.scratch_bytes(op, k), emitters.is_view)
    return {iv.name: iv for iv in plan.intervals}, plan


def test_dsm_buffer_lives_until_the_barrier_after_its_reduce():
    ivs, plan = _plan(splitk_gemv(4, 2, 64, 16, "f16"))
    buf = ivs["buf"]
    # ops: 0 load, 1 gemv, 2 smem_alloc, 3 smem_store, 4 barrier, 5 cluster_reduce, 6 barrier
    assert (buf.what, buf.start, buf.end) == ("dsm buffer", 2, 6)
    assert plan.offsets["xt"] == plan.offsets["buf"] == 0  # xt is dead before buf is allocated
    assert plan.total == 1536


def test_dsm_buffer_read_inside_a_region_lives_for_the_whole_kernel():
    ivs, plan = _plan(_IN_REGION)
    buf = ivs["buf"]
    assert (buf.what, buf.start) == ("buffer", 0) and buf.end >= 8
    assert plan.offsets["u"] != plan.offsets["buf"]  # never reuses the buffer's bytes


def test_dsm_buffer_without_a_later_barrier_lives_for_the_whole_kernel():
    text = _IN_REGION.replace("  cluster_barrier()\n  %u", "  %u")
    text = text.replace("  when() {on = cluster, lo = 0, hi = 1} ({\n", "").replace(
        "    store(%y, %s) {offsets = [\"0\"]}\n  })\n", "    store(%y, %s) {offsets = [\"0\"]}\n")
    ivs, _ = _plan(text, verify=False)  # (the verifier wants a barrier after the reduce)
    assert (ivs["buf"].what, ivs["buf"].start) == ("buffer", 0)


_TWO_READS = """kernel @k {grid = 1, cluster = 2, max_batch = 1} (%x: f32[64], %y: f32[64]) {
  %t = load(%x) {offsets = ["0"], sizes = [64]} : f32[64]
  %buf = smem_alloc() : f32[64]
  smem_store(%buf, %t)
  cluster_barrier()
  %v = reshape(%buf) {shape = [8, 8]} : f32[8, 8]
  %s = cluster_reduce(%buf) {op = sum} : f32[64]
  %m = cluster_reduce(%v) {op = max} : f32[8, 8]
  %mid = load(%x) {offsets = ["0"], sizes = [64]} : f32[64]
  cluster_barrier()
  %u = load(%x) {offsets = ["0"], sizes = [64]} : f32[64]
  store(%y, %s) {offsets = ["0"]}
  store(%y, %u) {offsets = ["0"]}
  store(%y, %mid) {offsets = ["0"]}
  return %y
}
"""


def test_dsm_buffer_read_twice_and_through_a_view_is_freed_after_the_last_read():
    ivs, plan = _plan(_TWO_READS, verify=False)
    buf = ivs["buf"]
    # ops: 0 load, 1 alloc, 2 store, 3 barrier, 4 reshape, 5 reduce, 6 reduce (view),
    # 7 load mid, 8 barrier, 9 load u
    assert (buf.what, buf.start, buf.end) == ("dsm buffer", 1, 8)
    # %mid (defined before the freeing barrier) never shares the buffer's bytes; %u (after
    # it) takes them: 3 x 256 B in all, where a whole-kernel buffer would need a fourth
    assert plan.offsets["mid"] != plan.offsets["buf"]
    assert plan.offsets["u"] == plan.offsets["buf"] and plan.total == 768
