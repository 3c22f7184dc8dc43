"""Deliberately broken tile programs are caught (by the verifier, and by the simulator when the
verifier is bypassed), each with its own message."""
from __future__ import annotations

import numpy as np
import pytest

from fusionc.errors import SimulationError, VerifyError
from fusionc.ir import parse_module
from fusionc.sim import simulate_kernel
from tests.sim.programs import splitk_gemv

GOOD = splitk_gemv(size=4, grid=2, k_tile=16, n_tile=8, dtype="f16")
REDUCE = "  %s = cluster_reduce(%buf) {op = sum} : f32[B, 8]\n"


def sim(text: str, verify: bool = True):
    m = parse_module(text, verify=verify)
    rng = np.random.default_rng(1)
    args = {"x": rng.standard_normal((3, 64)), "w": rng.standard_normal((16, 64)),
            "y": np.full((3, 16), np.nan)}
    return simulate_kernel(m.graphs[0], args)["y"]


def edit(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


def test_good_program_runs():
    assert np.all(np.isfinite(sim(GOOD)))


def test_missing_barrier_before_collective():
    bad = edit("  smem_store(%buf, %p)\n  cluster_barrier()\n", "  smem_store(%buf, %p)\n")
    with pytest.raises(VerifyError, match="stored at 5:3 in the same barrier phase: no "
                       "cluster_barrier makes it visible") as e:
        sim(bad)
    assert "6:8" in str(e.value)  # the collective's line:column
    with pytest.raises(SimulationError, match="written in the same barrier phase: no "
                       "cluster_barrier makes it visible") as e:
        sim(bad, verify=False)
    assert "6:8" in str(e.value)


def test_missing_barrier_before_exit():
    bad = edit(REDUCE + "  cluster_barrier()\n", REDUCE)
    with pytest.raises(VerifyError, match="may exit while peers still read its shared memory"):
        sim(bad)
    with pytest.raises(SimulationError, match="exits while peers may still read its shared "
                       "memory %buf"):
        sim(bad, verify=False)


def test_overwrite_while_peers_read():
    bad = edit(REDUCE + "  cluster_barrier()\n", REDUCE + "  smem_store(%buf, %p)\n"
               "  cluster_barrier()\n")
    with pytest.raises(VerifyError, match="overwrites %buf while peers may still read it"):
        sim(bad)
    with pytest.raises(SimulationError, match="overwrites %buf while peers may still read it"):
        sim(bad, verify=False)


def test_wrong_reduction_partner():
    bad = edit("{op = sum}", "{op = sum, masks = [1, 1]}")
    with pytest.raises(VerifyError, match=r"masks \[1, 1\] do not combine every rank"):
        sim(bad)
    with pytest.raises(SimulationError, match=r"wrong reduction partners: masks \[1, 1\] leave "
                       r"CTA 0 with contributions \[2, 2, 0, 0\]"):
        sim(bad, verify=False)
    with pytest.raises(SimulationError, match="mask 4 names no partner"):
        sim(edit("{op = sum}", "{op = sum, masks = [1, 4]}"), verify=False)


EARLY_EXIT = "  when() {on = rank, lo = 3, hi = 4} ({\n    exit()\n  })\n"


def test_cta_exits_early():
    bad = edit("  %xt = load", EARLY_EXIT + "  %xt = load")
    with pytest.raises(VerifyError, match="collective after a rank-dependent exit"):
        sim(bad)
    with pytest.raises(SimulationError, match="CTA 3 of cluster 0 has exited while its peers "
                       "wait at 'cluster_barrier'"):
        sim(bad, verify=False)


def test_cta_without_work_may_exit_after_last_collective():
    ok = edit("  return %y", EARLY_EXIT + "  return %y")
    assert np.all(np.isfinite(sim(ok)))


def test_collective_in_rank_branch():
    bad = edit(REDUCE, "  when() {on = rank, lo = 0, hi = 2} ({\n  " + REDUCE + "  })\n"
               ).replace("store(%y, %s)", "store(%y, %p)")
    with pytest.raises(VerifyError, match="collective inside a branch on the CTA rank"):
        sim(bad)
    with pytest.raises(SimulationError, match="wait at different collectives"):
        sim(bad, verify=False)


def test_collective_in_cluster_branch_is_fine():
    """A branch on the cluster id is taken by all CTAs of a cluster together."""
    ok = edit(REDUCE, "  when() {on = cluster, lo = 0, hi = 2} ({\n  " + REDUCE + "  })\n"
              ).replace("store(%y, %s)", "store(%y, %p)")
    parse_module(ok)  # verifies


def test_read_before_any_store():
    bad = edit("  smem_store(%buf, %p)\n", "")
    with pytest.raises(VerifyError, match="%buf is never stored before this collective"):
        sim(bad)
    with pytest.raises(SimulationError, match="never stored into %buf"):
        sim(bad, verify=False)


def test_out_of_bounds_tiles():
    with pytest.raises(VerifyError, match=r"tile \[8\*cluster \+ 4, \+8\) reaches 4..20"):
        sim(edit('offsets = ["0", "8*cluster"]', 'offsets = ["0", "8*cluster + 4"]'))
    with pytest.raises(SimulationError, match="leaves the tensor"):
        sim(edit('offsets = ["0", "8*cluster"]', 'offsets = ["0", "8*cluster + 4"]'),
            verify=False)


def test_racing_global_stores():
    bad = edit("when() {on = rank, lo = 0, hi = 1}", "when() {on = rank, lo = 0, hi = 2}")
    with pytest.raises(SimulationError, match="both store to the same elements of %y"):
        sim(bad)


@pytest.mark.parametrize("attrs,msg", [
    ("grid = 2, cluster = 3", "cluster size 3"),
    ("grid = 2, cluster = 32", "cluster size 32"),
    ("grid = 2, cluster = 16", "needs the non-portable cluster size attribute"),
    ("grid = 2, cluster = 4, threads = 100", "100 threads per CTA"),
])
def test_launch_shape_rules(attrs, msg):
    bad = GOOD.replace("grid = 2, cluster = 4", attrs)
    with pytest.raises(VerifyError, match=msg):
        parse_module(bad)


def test_shared_memory_limit():
    bad = GOOD.replace("%buf = smem_alloc() : f32[B, 8]",
                       "%big = smem_alloc() : f32[B, 8000]\n  %buf = smem_alloc() : f32[B, 8]")
    with pytest.raises(VerifyError, match=r"256256 bytes of shared memory per CTA"):
        parse_module(bad)


def test_store_to_input_is_rejected():
    bad = GOOD.replace("store(%y, %s)", "store(%x, %s)")
    with pytest.raises(VerifyError, match="store to %x, which the kernel does not return"):
        parse_module(bad)


def test_grid_reduce_in_rank_branch():
    """grid_reduce's arrival counter waits for every CTA: not inside a branch on the rank."""
    bad = GOOD.replace("    store(%y, %s) {offsets", "    grid_reduce(%y, %s) {offsets")
    with pytest.raises(VerifyError, match="'grid_reduce': collective inside a branch on the "
                       "CTA rank"):
        parse_module(bad)
