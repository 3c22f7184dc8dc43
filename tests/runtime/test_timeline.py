"""Timeline builds on the CPU: the stamp points codegen emits, and the reader's arithmetic on
counters written the way the GPU writes them (64-bit %globaltimer values per CTA and slot)."""
from __future__ import annotations

import numpy as np
import pytest

from fusionc.codegen import CodegenOptions, generate_cuda
from fusionc.ir import parse_module
from fusionc.runtime import timeline
from tests.codegen import programs as P
from tests.sim.programs import splitk_gemv


def _source(text, **opts):
    return generate_cuda(parse_module(text).graphs[0], CodegenOptions(**opts))


def test_stamps_name_entry_each_op_and_exit():
    src = _source(splitk_gemv(4, 3, 64, 32, "f16"), timeline=True)
    labels = list(src.stamps)
    assert labels[0] == "entry" and labels[-1] == "exit"
    assert any(s.endswith("= gemv") for s in labels)
    assert any(s.endswith("cluster_reduce") for s in labels)
    assert not any("smem_alloc" in s for s in labels)
    assert src.source.count("FC_STAMP(") == len(labels) + 1  # + the macro definition
    assert src.counters == src.stamp_base + 2 * len(labels) * src.blocks
    assert not _source(splitk_gemv(4, 3, 64, 32, "f16")).stamps


def test_grid_barrier_stamps_arrival_and_release():
    from tests.sim.test_grid_barrier import rotate
    src = _source(rotate(3, 2), timeline=True)
    assert [s.split(": ")[1] for s in src.stamps if s.startswith("grid barrier")] == [
        "arrive", "leave"]


def test_reader_first_median_last_and_op_time():
    src = _source(P.grid_sum(4, 3, 100), timeline=True)
    n, ctas = len(src.stamps), src.blocks
    t = np.zeros((ctas, n), np.uint64)
    epoch = np.uint64(1_764_470_000_000_000_000)  # %globaltimer: ns since 1970 (float64 steps
    for c in range(ctas):  # of 256 ns there); CTA c enters at + c ns, later slots 2.096 µs apart
        t[c] = epoch + np.uint64(c) + np.uint64(2096) * np.arange(n, dtype=np.uint64)
    t[ctas - 1, 1:-1] = 0  # one CTA stored only entry and exit (e.g. it exited early)
    counters = np.zeros(src.counters, np.uint32)
    counters[src.stamp_base:] = t.reshape(-1).view(np.uint32)
    rows = timeline.stamps(src, counters)
    assert rows[0].label == "entry" and rows[0].first == 0.0
    assert rows[0].last == (ctas - 1) / 1e3  # exact to the ns
    assert rows[1].ctas == ctas - 1 and rows[1].step == 2.096
    assert rows[-1].label == "exit" and rows[-1].ctas == ctas
    assert "op µs" in timeline.table(rows)
