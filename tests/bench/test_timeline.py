"""benchmarks/timeline.py on the CPU: reading a Chrome trace's kernels and cutting replays."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import timeline  # noqa: E402


def test_kernels_of_a_trace_sorted_by_start_without_host_events():
    trace = {"traceEvents": [
        {"cat": "kernel", "name": "b", "ts": 20.0, "dur": 3.0},
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 1.0, "dur": 9.0},
        {"cat": "kernel", "name": "a", "ts": 10.0, "dur": 5.0},
        {"cat": "kernel", "name": "no-duration", "ts": 30.0}]}
    assert timeline.kernels_of(trace) == [(10.0, 5.0, "a"), (20.0, 3.0, "b")]


def test_replays_cut_whole_replays_and_drop_a_partial_tail():
    ks = [(float(i), 1.0, f"k{i % 3}") for i in range(8)]
    runs = timeline.replays(ks, 3)
    assert [len(r) for r in runs] == [3, 3] and runs[1][0][2] == "k0"


def test_only_known_benchmarks_are_accepted(capsys):
    assert timeline.main(["gemv"]) == 2 and "usage" in capsys.readouterr().out


def test_shares_of_overlapping_kernels_sum_to_the_span_and_the_table_takes_medians():
    # two calls of (a, b); b starts before a ends, the second call's a before the first's b ends
    run = [(0.0, 10.0, "a"), (8.0, 4.0, "b"), (11.0, 10.0, "a"), (19.0, 4.0, "b")]
    tl = timeline.with_shares(run)
    assert [round(x[2], 6) for x in tl] == [10.0, 2.0, 9.0, 2.0]
    assert sum(x[2] for x in tl) == tl[-1][0] + tl[-1][1]   # 23: the span
    rows = timeline.table(tl, 2).splitlines()
    assert rows[2].split("|")[1:6] == [" a ", " 10.00 ", " 0.00 ", " 10.00 ", " 9.50 "]
    assert rows[3].split("|")[1:6] == [" b ", " 4.00 ", " 8.00 ", " 12.00 ", " 2.00 "]
    assert "11.50 (4 kernels, 2 calls)" in rows[4]
