"""The model front on the CPU: config.json and safetensors loading (one file and sharded),
graph construction, and teacher-forced decode steps in the interpreter against a float64 numpy
forward pass written from the equations (tests/models/reference.py); clear errors for broken
model folders."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from fusionc.errors import InputError, NumericsError
from fusionc.interp.numerics import relative_error
from fusionc.models import (HostDecoder, Sampling, config_from_dict, generate, load_config,
                            sample)
from fusionc.models.random import write_model
from tests.models import reference

LLAMA31 = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
               num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
               num_hidden_layers=2, vocab_size=97, rms_norm_eps=1e-5, rope_theta=500000.0,
               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
               tie_word_embeddings=True, max_position_embeddings=32, torch_dtype="float16")
QWEN3 = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=48,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=80,
             num_hidden_layers=2, vocab_size=101, rms_norm_eps=1e-6, rope_theta=1000000.0,
             tie_word_embeddings=False, max_position_embeddings=32, torch_dtype="bfloat16")


F32 = {"torch_dtype": "float32"}


@pytest.mark.parametrize("raw,shards,precise,tol", [
    (LLAMA31, 1, False, 1e-2), (QWEN3, 3, True, 1e-2), (LLAMA31 | F32, 2, True, 1e-5),
    (QWEN3 | F32, 1, True, 1e-5)],
    ids=["llama3.1-f16", "qwen3-bf16", "llama3.1-f32", "qwen3-f32"])
def test_teacher_forced_steps_match_float64_forward(tmp_path, raw, shards, precise, tol):
    """Seeded: the bf16 case's error is ~5e-3 (median over seeds) and exceeds 1e-2 for a few
    seeds in a thousand.
f16 with every op result rounded (the interpreter's GPU semantics) and bf16 with fp32
    inside blocks (``precise``: rounding only where the GPU stores) within 1e-2; f32 storage
    with float64 arithmetic equals the independent float64 forward up to f32 storage rounding
    (checks the graphs' structure: RoPE pairing and scaling, GQA, QK-norm, tied head)."""
    rng = np.random.default_rng(0)
    tensors = write_model(tmp_path, raw, rng, shards)
    dec = HostDecoder.from_pretrained(tmp_path, batch=2, max_seq=16, precise=precise)
    cfg = dec.cfg
    seqs = rng.integers(0, cfg.vocab, (2, 12))
    ref = [reference.forward(tensors, cfg, s) for s in seqs]          # [T, vocab] per row
    for t in range(seqs.shape[1]):
        logits = dec.step(seqs[:, t], [t, t])
        assert not np.isnan(logits).any()
        for b in range(2):
            assert relative_error(logits[b], ref[b][t]) <= tol, (t, b)


def test_rows_at_different_positions(tmp_path):
    """Each row has its own position and KV length (f32 storage, float64 arithmetic: exact)."""
    rng = np.random.default_rng()
    tensors = write_model(tmp_path, QWEN3 | F32, rng)
    dec = HostDecoder.from_pretrained(tmp_path, batch=2, max_seq=16, precise=True)
    a, b = rng.integers(0, dec.cfg.vocab, 5), rng.integers(0, dec.cfg.vocab, 3)
    for t in range(3):
        dec.step([a[t], b[t]], [t, t])
    logits = dec.step([a[3], b[2]], [3, 2])   # row 1 recomputes position 2: same cache state
    assert relative_error(logits[0], reference.forward(tensors, dec.cfg, a[:4])[3]) <= 1e-5
    assert relative_error(logits[1], reference.forward(tensors, dec.cfg, b[:3])[2]) <= 1e-5


def test_greedy_generation_follows_the_reference(tmp_path):
    rng = np.random.default_rng(1)
    tensors = write_model(tmp_path, LLAMA31, rng)
    dec = HostDecoder.from_pretrained(tmp_path, batch=1, max_seq=16)
    prompt = rng.integers(0, dec.cfg.vocab, 4)
    gen = generate(dec, prompt, 8)
    seq = np.concatenate([prompt, gen.tokens[0]])
    ref = reference.forward(tensors, dec.cfg, seq)
    for j, tok in enumerate(gen.tokens[0]):
        row = ref[len(prompt) - 1 + j]
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] > 0.01 * (row.max() - row.min()):
            assert tok == row.argmax(), j


def test_config_fields():
    c = config_from_dict(LLAMA31)
    assert (c.arch, c.head_dim, c.kv_heads, c.tie_embeddings) == ("llama", 16, 2, True)
    assert c.rope_scaling == (8.0, 1.0, 4.0, 64.0)
    v5 = {k: v for k, v in LLAMA31.items() if k not in ("rope_scaling", "rope_theta")}
    v5["rope_parameters"] = LLAMA31["rope_scaling"] | {"rope_theta": 500000.0}   # transformers 5
    assert config_from_dict(v5) == c
    q = config_from_dict(QWEN3)
    assert (q.arch, q.head_dim, q.qk_norm, q.dtype) == ("qwen3", 32, True, "bf16")


@pytest.mark.parametrize("change,match", [
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, "unsupported arch"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn'"),
    ({"num_key_value_heads": 3}, "not a multiple"),
    ({"hidden_size": 0}, "hidden_size = 0"),
    ({"torch_dtype": "int8"}, "dtype 'int8'"),
    ({"attention_bias": True}, "attention_bias"),
    ({"architectures": 5}, "architectures = 5"),
    ({"rms_norm_eps": "abc"}, "rms_norm_eps = 'abc'"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps = -1.0"),
    ({"rope_theta": 0}, "rope_theta = 0"),
    ({"max_position_embeddings": 1.9}, "max_position_embeddings = 1.9"),
    ({"head_dim": 32.5}, "head_dim = 32.5"),
    ({"head_dim": 33}, "even head_dim"),
    ({"hidden_size": 2}, "not a multiple"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings = 'false'"),
    ({"rope_scaling": "llama3"}, "rope_scaling = 'llama3'"),
    ({"rope_scaling": LLAMA31["rope_scaling"] | {"factor": 0}}, "factor = 0"),
    ({"rope_scaling": LLAMA31["rope_scaling"] | {"low_freq_factor": 4.0}}, "low_freq_factor"),
    ({"use_sliding_window": True}, "use_sliding_window"),
])
def test_bad_configs_are_refused(change, match):
    with pytest.raises(InputError, match=match):
        config_from_dict(LLAMA31 | change)


def test_config_that_is_not_an_object_or_a_folder(tmp_path):
    with pytest.raises(InputError, match="a JSON object"):
        config_from_dict([1, 2])
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="a JSON object"):
        load_config(tmp_path)
    with pytest.raises(InputError, match="not a folder"):
        load_config(tmp_path / "config.json")
    with pytest.raises(InputError, match="does not exist"):
        load_config(tmp_path / "nope")


def test_missing_folder_and_config(tmp_path):
    with pytest.raises(InputError, match="config.json"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31))
    with pytest.raises(InputError, match="no \\*.safetensors"):
        HostDecoder.from_pretrained(tmp_path)


def test_missing_tensor_wrong_shape_truncated_file(tmp_path):
    rng = np.random.default_rng()
    tensors = write_model(tmp_path, QWEN3, rng)
    name = "model.layers.1.self_attn.k_norm.weight"
    save_file({k: v for k, v in tensors.items() if k != name}, tmp_path / "model.safetensors")
    with pytest.raises(InputError, match=f"tensor '{name}' is missing"):
        HostDecoder.from_pretrained(tmp_path, max_seq=8)
    bad = dict(tensors)
    bad["model.layers.0.mlp.down_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(bad, tmp_path / "model.safetensors")
    with pytest.raises(InputError, match=r"down_proj.weight' in model.safetensors has shape "
                                         r"\[80, 48\].*valid: \[48, 80\]"):
        HostDecoder.from_pretrained(tmp_path, max_seq=8)
    save_file(tensors, tmp_path / "model.safetensors")
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="model.safetensors"):
        HostDecoder.from_pretrained(tmp_path, max_seq=8)


def test_bad_weights_and_shard_index(tmp_path):
    rng = np.random.default_rng()
    tensors = write_model(tmp_path, QWEN3, rng)
    bad = dict(tensors)
    bad["model.norm.weight"] = np.ones(48, np.int8)
    save_file(bad, tmp_path / "model.safetensors")
    with pytest.raises(InputError, match="model.norm.weight.*dtype int8"):
        HostDecoder.from_pretrained(tmp_path, max_seq=8)
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": [1, 2]}')
    with pytest.raises(InputError, match="weight_map is not an object"):
        HostDecoder.from_pretrained(tmp_path, max_seq=8)


def test_nan_weights_are_reported_not_decoded(tmp_path):
    tensors = write_model(tmp_path, QWEN3, np.random.default_rng())
    tensors["model.layers.0.mlp.down_proj.weight"][0, 0] = np.nan
    save_file(tensors, tmp_path / "model.safetensors")
    dec = HostDecoder.from_pretrained(tmp_path, max_seq=8)
    with pytest.raises(NumericsError, match="NaN"):
        generate(dec, [1, 2], 2)


def test_step_and_generate_argument_errors(tmp_path):
    write_model(tmp_path, LLAMA31, np.random.default_rng())
    dec = HostDecoder.from_pretrained(tmp_path, max_seq=8)
    with pytest.raises(InputError, match="token ids"):
        dec.step([97], [0])
    with pytest.raises(InputError, match="max_seq = 8"):
        dec.step([1], [8])
    with pytest.raises(InputError, match="1 of each"):
        dec.step([1, 2], [0, 1])
    with pytest.raises(InputError, match="non-empty"):
        generate(dec, [], 4)
    with pytest.raises(InputError, match="max_seq"):
        generate(dec, [1, 2, 3], 7)
    with pytest.raises(InputError, match="top_p"):
        Sampling(temperature=1.0, top_p=0.0)
    for bad in ([2**70], [1.5, 2.5], ["5"], [True], [[1, 2], [3]], None):
        with pytest.raises(InputError, match="prompt"):
            generate(dec, bad, 2)
    with pytest.raises(InputError, match="tokens"):
        dec.step([1.9], [0])
    with pytest.raises(InputError, match="sampling"):
        generate(dec, [1], 2, None)
    for kw in ({"temperature": float("inf")}, {"temperature": "0.5"}, {"seed": -1},
               {"seed": 1.5}):
        with pytest.raises(InputError):
            Sampling(**kw)
    with pytest.raises(InputError, match="max_position_embeddings 32"):
        HostDecoder.from_pretrained(tmp_path, max_seq=10**12)
    with pytest.raises(InputError, match="max_seq = 0"):
        HostDecoder.from_pretrained(tmp_path, max_seq=0)
    assert generate(dec, [1], np.int64(2)).tokens.shape == (1, 2)     # numpy integers are fine
    logits = np.array([[0.0, 50.0, 49.0]], np.float32)
    assert int(sample(logits, Sampling(1e-300), np.random.default_rng())[0]) == 1  # no NaN


def test_sampling_top_p_and_seed():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    rng = np.random.default_rng(0)
    picks = {int(sample(logits, Sampling(1.0, 0.7, 0), rng)[0]) for _ in range(200)}
    assert picks == {0, 1}                         # the nucleus at p = 0.7 is {0, 1}
    assert int(sample(logits, Sampling(1.0, 0.4), rng)[0]) == 0
    a = [int(sample(logits, Sampling(1.0), Sampling(1.0, seed=5).rng())[0]) for _ in range(3)]
    assert len(set(a)) == 1                        # same seed, same draw
    assert int(sample(logits, Sampling(), rng)[0]) == 0   # greedy


@settings(max_examples=12, deadline=None)
@given(arch=st.sampled_from(["llama", "qwen3"]), kv_heads=st.sampled_from([1, 2, 4]),
       group=st.sampled_from([1, 2]), head_dim=st.sampled_from([8, 16]),
       tied=st.booleans(), scaled=st.booleans(), seed=st.integers(0, 2**16))
def test_random_configs_match_the_float64_forward(arch, kv_heads, group, head_dim, tied, scaled,
                                                  seed):
    """Any supported combination (architecture, GQA ratio, head_dim ≠ hidden/heads, tied head,
    Llama 3.1 scaling): f32 storage with float64 arithmetic equals the independent forward."""
    import tempfile
    from pathlib import Path
    heads = kv_heads * group
    raw = dict(architectures=["LlamaForCausalLM" if arch == "llama" else "Qwen3ForCausalLM"],
               hidden_size=32, num_attention_heads=heads, num_key_value_heads=kv_heads,
               head_dim=head_dim, intermediate_size=48, num_hidden_layers=2, vocab_size=50,
               rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied,
               max_position_embeddings=16, torch_dtype="float32")
    if scaled:
        raw["rope_scaling"] = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 2.0, "original_max_position_embeddings": 16}
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as d:
        tensors = write_model(Path(d), raw, rng)
        dec = HostDecoder.from_pretrained(d, max_seq=8, precise=True)
        toks = rng.integers(0, 50, 5)
        ref = reference.forward(tensors, dec.cfg, toks)
        for t in range(5):
            assert relative_error(dec.step(toks[t:t + 1], [t])[0], ref[t]) <= 1e-5, t
