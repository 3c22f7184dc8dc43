"""Tensor parallelism on the CPU: a checkpoint read shard by shard equals the whole layer
sharded in memory, and a decoder over simulated ranks (``HostDecoder(tp=N)``, ``fusionc
generate --tp N --cpu``) gives the logits and tokens of one rank."""
import numpy as np
import pytest

import fusionc.cli
from fusionc.errors import InputError
from fusionc.models import HostDecoder, generate, load_config
from fusionc.models.random import write_random_model
from fusionc.models.tp import layer_shard, shard_weights
from fusionc.models.weights import SafetensorsWeights, layer_weights


@pytest.fixture(scope="module", params=["float16", "bfloat16"])
def model(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("tp") / request.param
    write_random_model(d, "llama", num_hidden_layers=2, dtype=request.param)
    return d


def test_a_rank_reads_its_shard_of_the_checkpoint(model):
    cfg, src = load_config(model), SafetensorsWeights(model)
    whole = layer_weights(src, cfg, 1)
    for r in range(2):
        want = shard_weights(whole, r, 2, heads=cfg.heads, kv_heads=cfg.kv_heads,
                             head_dim=cfg.head_dim, intermediate=cfg.intermediate)
        got = layer_shard(src, cfg, 1, r, 2)
        assert got.keys() == want.keys()
        for k in want:
            assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k


@pytest.mark.parametrize("batch", [1, 2])
def test_two_simulated_ranks_decode_like_one(model, batch):
    one = HostDecoder.from_pretrained(model, batch=batch, max_seq=16)
    two = HostDecoder.from_pretrained(model, batch=batch, max_seq=16, tp=2)
    prompt = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]][:batch])
    a = generate(one, prompt, 6, keep_logits=True)
    b = generate(two, prompt, 6, keep_logits=True)
    assert np.array_equal(a.tokens, b.tokens)
    for la, lb in zip(a.logits, b.logits):   # partial sums rounded per rank: 16-bit budget
        assert np.linalg.norm(la - lb) / np.linalg.norm(la) <= 1e-2


def test_generate_tp2_cpu_prints_the_tokens_of_tp1(model, capsys):
    args = ["generate", "--model", str(model), "--prompt-tokens", "5,6,7",
            "--max-new-tokens", "5", "--cpu"]
    assert fusionc.cli.main(args) == 0
    tp1 = capsys.readouterr().out.splitlines()
    assert fusionc.cli.main(args + ["--tp", "2"]) == 0
    tp2 = capsys.readouterr().out.splitlines()
    assert tp1[0] == tp2[0] and "2 simulated ranks" in tp2[1]


def test_sizes_and_models_that_do_not_shard_are_named(model, tmp_path, capsys):
    with pytest.raises(InputError, match="tp = 3 ranks for heads = 4"):
        HostDecoder.from_pretrained(model, max_seq=8, tp=3)
    q = tmp_path / "qwen3"
    write_random_model(q, "qwen3", num_hidden_layers=1)
    with pytest.raises(InputError, match="QK-norm"):
        HostDecoder.from_pretrained(q, max_seq=8, tp=2)
    assert fusionc.cli.main(["generate", "--model", str(model), "--prompt-tokens", "1",
                             "--max-new-tokens", "1", "--tp", "2"]) == 1
    assert "--tp 2 on GPUs" in capsys.readouterr().err


def test_the_gpu_decoder_names_its_tp_limit(model):
    from fusionc.models import Decoder
    with pytest.raises(InputError, match=r"Decoder\(tp=2\) on GPUs"):
        Decoder(load_config(model), tp=2)   # refused before anything needs a GPU


def test_bad_ranks_and_sizes_of_the_shard_helpers_are_named(model):
    cfg, src = load_config(model), SafetensorsWeights(model)
    whole = layer_weights(src, cfg, 0)
    sizes = dict(heads=cfg.heads, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                 intermediate=cfg.intermediate)
    for rank, match in ((2, "rank 2 of tp = 2"), (1.5, "rank = 1.5"), ("0", "rank = '0'")):
        with pytest.raises(InputError, match=match):
            shard_weights(whole, rank, 2, **sizes)
        with pytest.raises(InputError, match=match):
            layer_shard(src, cfg, 0, rank, 2)
    with pytest.raises(InputError, match="whole-layer w_qkv of shape"):
        shard_weights(whole, 0, 2, **dict(sizes, heads=2 * cfg.heads))
    two = HostDecoder.from_pretrained(model, max_seq=8, tp=np.int64(2))
    assert two.tp == 2


@pytest.mark.parametrize("chunk", [3, 256])
def test_two_simulated_ranks_prefill_like_one(model, chunk):
    rng = np.random.default_rng(chunk)
    prompts = [rng.integers(0, 80, 9), rng.integers(0, 80, 4)]
    ref = HostDecoder.from_pretrained(model, batch=2, max_seq=16, precise=True).prefill(prompts)
    one = HostDecoder.from_pretrained(model, batch=2, max_seq=16)
    two = HostDecoder.from_pretrained(model, batch=2, max_seq=16, tp=2)
    a, b = one.prefill(prompts, chunk=chunk), two.prefill(prompts, chunk=chunk)
    err = [np.linalg.norm(x - ref) / np.linalg.norm(ref) for x in (a, b)]
    # bf16's own rounding through two layers is ~1e-2 on one rank: two ranks may add a quarter
    assert err[1] <= max(1e-2, 1.25 * err[0]), err


def test_layers_of_the_wrong_form_are_named(model):
    cfg, src = load_config(model), SafetensorsWeights(model)
    shards = [layer_shard(src, cfg, 0, r, 2) for r in range(2)]
    from fusionc.models.weights import head_weights
    one = HostDecoder(cfg, max_seq=8)
    with pytest.raises(InputError, match="a dict of the whole layer's weights"):
        one.load([shards] * cfg.layers, head_weights(src, cfg))
    four = HostDecoder(cfg, max_seq=8, tp=2)
    with pytest.raises(InputError, match="a list of 2 rank shards"):
        four.load([shards[:1]] * cfg.layers, head_weights(src, cfg))
