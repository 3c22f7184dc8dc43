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


def _fused_block_source(**opts):
    from fusionc.codegen.streamed import generate_streamed
    from fusionc.passes import run_pipeline
    from tests.passes.test_attention_o import FUSED, _fused
    from tests.passes.test_attention_v2 import block
    low = run_pipeline(block("bf16", hidden=3072, heads=24, kv_heads=8, head_dim=128,
                             max_seq=1024), FUSED(1, rows=128))
    return generate_streamed(_fused(low), CodegenOptions(**opts))


def test_a_streamed_kernel_stamps_both_roles_before_its_error_word():
    """The fused attention block (QKV phase, attention phase, O phase): the producer's and the
    consumers' points, the slots before the error word (still the last counter word)."""
    src, plain = _fused_block_source(timeline=True), _fused_block_source()
    labels = list(src.stamps)
    assert labels[0] == "entry" and labels.count("consumers: phase 1 done") == 1
    for want in ("consumers: the QKV flushes acquired", "consumers: attention units done",
                 "producer: phase 1's signals acquired", "producer: phase 0's copies issued",
                 "consumers: phase 1 done"):
        assert want in labels
    assert src.source.count("FC_STAMP_AT(") == len(labels) + 1   # + the macro definition
    assert src.stamp_base % 2 == 0 and src.stamp_base >= plain.counters - 1
    assert src.counters == src.stamp_base + 2 * len(labels) * src.blocks + 1
    err = f"fc_counters + {src.counters - 1}"
    assert err in src.source and f"fc_counters + {plain.counters - 1}," not in src.source
    assert not plain.stamps and "FC_STAMP_AT" not in plain.source


def test_reader_orders_a_streamed_kernels_slots_by_time():
    src = _fused_block_source(timeline=True)
    n, ctas = len(src.stamps), src.blocks
    at = {label: i for i, label in enumerate(src.stamps)}
    when = {"entry": 0, "producer: phase 0's first weights issued": 1000,
            "consumers: phase 0 done": 9000, "consumers: the QKV flushes acquired": 10000,
            "consumers: attention units done": 20000}   # ns; the rest at 30 µs and on
    t = np.zeros((ctas, n), np.uint64)
    epoch = np.uint64(1_764_470_000_000_000_000)
    for label, k in at.items():
        t[:, k] = epoch + np.uint64(when.get(label, 30000 + 100 * k))
    counters = np.zeros(src.counters, np.uint32)
    counters[src.stamp_base:src.stamp_base + 2 * n * ctas] = t.reshape(-1).view(np.uint32)
    rows = timeline.stamps(src, counters)
    assert [r.label for r in rows[:5]] == list(when)
    assert rows[4].step == 10.0 and rows[4].median == 20.0   # the attention units' own time
