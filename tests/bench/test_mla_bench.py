"""benchmarks/mla.py on the CPU: the two layers, the sweep's points and shards, and the floor
(bytes or FLOPs, DESIGN §7) — no GPU, no torch."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import mla  # noqa: E402


def test_two_layers_and_the_issue_sweep_sharded_in_order():
    every = mla.points(mla.parse([]))
    assert len(every) == 2 * 4 * 3 and ("V3", 256, 16384) in every
    shards = [mla.points(mla.parse(["--shard", f"{i}/4"])) for i in range(4)]
    assert sorted(sum(shards, [])) == sorted(every) and shards[1][0] == every[1]
    some = mla.points(mla.parse(["--layer", "V3", "--batch", "1", "--kv", "1024,4096"]))
    assert some == [("V3", 1, 1024), ("V3", 1, 4096)]
    assert not hasattr(mla.parse([]), "lowering")   # v2 is MLA's only lowering


def test_both_layers_lower_on_the_mla_units():
    from fusionc.lower import mla_v2
    from fusionc.runtime.pipelines import first_passes, v2_default_pipeline
    for m in mla.LAYERS.values():
        g = mla.build(m, 1024)["attention"]
        assert mla_v2.covers(first_passes(g)) and "partition-units" in v2_default_pipeline(g, 1)


def test_the_floor_is_bytes_at_one_row_and_flops_with_128_heads_at_many():
    v2, v3 = mla.LAYERS["V2-Lite"], mla.LAYERS["V3"]
    bw = 4.2e12
    assert mla.floor_us(v2, 1, 1024, bw)[1] == "bytes"
    t, bound = mla.floor_us(v3, 256, 16384, bw)
    assert bound == "flops" and abs(t - mla.flops(v3, 256, 16384) / 790e12 * 1e6) < 1e-6
    # the cache rows dominate V2-Lite at batch 16 and KV 16K: 16 · 16384 · 576 · 2 bytes
    assert mla.floor_bytes(v2, 16, 16384) - mla.floor_bytes(v2, 16, 0) == 16 * 16384 * 576 * 2


def test_alt_builds_w_uv_and_w_o_chained_or_one_kernel_each():
    """``--alt chain`` at one row puts W_UV and w_o in one kernel (four kernels, not five)."""
    from fusionc.lower.linear_v2 import WIDE_ROWS
    from fusionc.passes import parse_pipeline, run_pipeline
    from fusionc.passes.stream import v2_pipeline
    assert mla.parse(["--alt", "chain"]).alt == "chain" and mla.parse([]).alt is None
    g = mla.build(mla.LAYERS["V2-Lite"], 1024)
    kernels = {chain: [k for k in run_pipeline(g, parse_pipeline(
        v2_pipeline(1, chain=chain, rows=WIDE_ROWS))).graphs if k.kind == "kernel"]
        for chain in (False, True)}
    assert (len(kernels[False]), len(kernels[True])) == (5, 4)
