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
