"""Qwen2 / Qwen2.5 (q, k, v projection bias; tied or untied head) on the CPU path against the
float64 forward; the GPU Decoder refuses them by name; tiny random models from the package and
the ``fusionc random-model`` command."""
import json

import numpy as np
import pytest

import fusionc.cli
from fusionc.errors import CompileError, InputError
from fusionc.interp.numerics import relative_error
from fusionc.models import Decoder, HostDecoder, config_from_dict, generate, load_config
from fusionc.models.random import TINY, write_random_model
from tests.models import reference

F32 = {"torch_dtype": "float32"}


@pytest.mark.parametrize("fields,precise,tol", [
    ({}, True, 1e-2), (F32, True, 1e-5), (F32 | {"tie_word_embeddings": False}, True, 1e-5),
    ({"torch_dtype": "float16", "tie_word_embeddings": False}, False, 1e-2)],
    ids=["bf16-tied", "f32-tied", "f32-untied", "f16-untied"])
def test_qwen2_teacher_forced_steps_match_float64_forward(tmp_path, fields, precise, tol):
    tensors = write_random_model(tmp_path, "qwen2", seed=3, **fields)
    assert "model.layers.1.self_attn.k_proj.bias" in tensors
    assert ("lm_head.weight" in tensors) == (fields.get("tie_word_embeddings") is False)
    dec = HostDecoder.from_pretrained(tmp_path, batch=2, max_seq=16, precise=precise)
    assert dec.cfg.qkv_bias and not dec.cfg.qk_norm
    assert "qkv_bias" in [p.name for p in dec.module["attention"].params]
    seqs = np.random.default_rng(4).integers(0, dec.cfg.vocab, (2, 10))
    ref = [reference.forward(tensors, dec.cfg, s) for s in seqs]
    for t in range(seqs.shape[1]):
        logits = dec.step(seqs[:, t], [t, t])
        for b in range(2):
            assert relative_error(logits[b], ref[b][t]) <= tol, (t, b)


def test_the_bias_matters(tmp_path):
    """Zeroing the biases changes the logits: the graphs do read them."""
    tensors = write_random_model(tmp_path, "qwen2", **F32)
    dec = HostDecoder.from_pretrained(tmp_path, max_seq=8, precise=True)
    zero = {k: (v * 0 if k.endswith(".bias") else v) for k, v in tensors.items()}
    got = dec.step([5], [0])[0]
    assert relative_error(got, reference.forward(tensors, dec.cfg, [5])[0]) <= 1e-5
    assert relative_error(got, reference.forward(zero, dec.cfg, [5])[0]) > 1e-3


def test_qwen2_config_and_missing_bias(tmp_path):
    cfg = config_from_dict(TINY["qwen2"])
    assert (cfg.arch, cfg.qkv_bias, cfg.head_dim, cfg.tie_embeddings) == ("qwen2", True, 16, True)
    assert not config_from_dict(TINY["qwen3"]).qkv_bias
    assert cfg.weight_bytes() > config_from_dict(TINY["qwen2"] | {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama"}).weight_bytes()
    tensors = write_random_model(tmp_path, "qwen2")
    from safetensors.numpy import save_file
    name = "model.layers.0.self_attn.v_proj.bias"
    save_file({k: v for k, v in tensors.items() if k != name}, tmp_path / "model.safetensors")
    with pytest.raises(InputError, match=f"tensor '{name}' is missing"):
        HostDecoder.from_pretrained(tmp_path, max_seq=8)


def test_gpu_decoder_refuses_qwen2_by_name():
    with pytest.raises(CompileError, match=r"'linear': qwen2 model: the q, k and v projections "
                                           r"have a bias.*CPU path.*--cpu"):
        Decoder(config_from_dict(TINY["qwen2"]), max_seq=8)


def test_generate_command_refuses_qwen2_on_the_gpu(tmp_path, capsys):
    write_random_model(tmp_path, "qwen2")
    code = fusionc.cli.main(["generate", "--model", str(tmp_path), "--prompt-tokens", "1,2",
                             "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == 1 and "have a bias" in err and "--cpu" in err, err


@pytest.mark.parametrize("kind", sorted(TINY))
def test_write_random_model_every_kind(tmp_path, kind):
    tensors = write_random_model(tmp_path / kind, kind, seed=1, num_hidden_layers=3, shards=2)
    cfg = load_config(tmp_path / kind)
    assert (cfg.arch, cfg.layers) == (kind, 3)
    assert (tmp_path / kind / "model.safetensors.index.json").exists()
    dec = HostDecoder.from_pretrained(tmp_path / kind, max_seq=8, precise=True)
    ref = reference.forward(tensors, cfg, [1, 2])
    assert relative_error(dec.step([1], [0])[0], ref[0]) <= 1e-2
    again = write_random_model(tmp_path / "again", kind, seed=1, num_hidden_layers=3)
    assert all(np.array_equal(again[k], v) for k, v in tensors.items())   # seeded


def test_write_random_model_errors(tmp_path):
    with pytest.raises(InputError, match="random model kind 'gpt2'"):
        write_random_model(tmp_path, "gpt2")
    with pytest.raises(InputError, match="hidden_size = 0"):
        write_random_model(tmp_path, "llama", hidden_size=0)
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="cannot create"):
        write_random_model(tmp_path / "file" / "sub", "llama")


def test_random_model_command_then_generate_cpu(tmp_path, capsys):
    d = tmp_path / "tiny"
    assert fusionc.cli.main(["random-model", str(d), "--kind", "llama", "--layers", "1",
                             "--dtype", "float32", "--untied"]) == 0
    assert "wrote a random llama model" in capsys.readouterr().out
    raw = json.loads((d / "config.json").read_text())
    assert (raw["num_hidden_layers"], raw["torch_dtype"], raw["tie_word_embeddings"]) == \
        (1, "float32", False)
    assert fusionc.cli.main(["generate", "--model", str(d), "--prompt-tokens", "1,2,3",
                             "--max-new-tokens", "4", "--cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out[0].split(",")) == 4 and "CPU interpreter" in out[1]
    dec = HostDecoder.from_pretrained(d, max_seq=8)
    assert generate(dec, [1, 2, 3], 4).tokens.shape == (1, 4)
