"""benchmarks/decode.py on the CPU: the four model families, the points that fit and their
shards, and the floor (no GPU, no torch)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import decode  # noqa: E402


def test_four_families_with_their_distinguishing_features():
    m = decode.MODELS
    assert list(m) == ["Llama-2-7B", "Llama-3-8B", "Qwen3-4B", "Llama-3.2-3B"]
    q, l32 = m["Qwen3-4B"], m["Llama-3.2-3B"]
    assert q.qk_norm and q.heads * q.head_dim != q.hidden and q.tie_embeddings
    assert (l32.hidden, l32.heads, l32.kv_heads, l32.intermediate) == (3072, 24, 8, 8192)
    assert l32.tie_embeddings and l32.rope_scaling == (32.0, 1.0, 4.0, 8192.0)
    assert 7.5e9 < q.weight_bytes() < 8.5e9 and 6e9 < l32.weight_bytes() < 7e9


def test_points_skip_what_does_not_fit_and_shard_in_order():
    every = decode.points(decode.parse([]))
    assert ("Llama-3-8B", 64, 8192) in every and ("Llama-3-8B", 256, 8192) not in every
    assert ("Llama-2-7B", 256, 1024) not in every   # 137 GB of MHA caches
    assert all(decode.fits(decode.MODELS[m], b, k) for m, b, k in every)
    shards = [decode.points(decode.parse(["--shard", f"{i}/3"])) for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(every) and shards[0][0] == every[0]
    some = decode.points(decode.parse(["--model", "Qwen3-4B", "--batch", "1,4", "--kv", "1024"]))
    assert some == [("Qwen3-4B", 1, 1024), ("Qwen3-4B", 4, 1024)]


def test_the_floor_reads_the_batch_rows_of_an_untied_table_only():
    c = decode.MODELS["Llama-3-8B"]
    table = c.vocab * c.hidden * 2
    assert decode.floor_bytes(c, 1, 1024) == \
        c.weight_bytes() - table + c.hidden * 2 + decode.kv_bytes(c, 1, 1024)
    t = decode.MODELS["Qwen3-4B"]   # tied: the table is read once, as the LM head
    assert decode.floor_bytes(t, 1, 1024) == \
        t.weight_bytes() + t.hidden * 2 + decode.kv_bytes(t, 1, 1024)


def test_prefill_benchmark_arguments():
    from benchmarks import prefill
    a = prefill.parse([])
    assert a.model == "Llama-3-8B" and a.prompt == (512, 2048) and a.chunk == 256
    assert prefill.parse(["--prompt", "64", "--no-steps"]).prompt == (64,)
