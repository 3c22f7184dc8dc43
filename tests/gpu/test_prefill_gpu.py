"""Prompts in chunks on the GPU (``Decoder.prefill``: cuBLAS GEMMs, and the library kernels of
``fusionc.runtime.library_attention`` for RoPE, the KV-cache write and causal attention): the
logits after a chunked prompt against the float64 interpreter (``HostDecoder(precise=True)``)
and against one decode step per token, at chunk sizes that split the prompts anywhere, prompts
of different lengths; decoding goes on from the caches the chunks wrote."""
from __future__ import annotations

import numpy as np
import pytest

from fusionc.models import Decoder, HostDecoder, generate
from fusionc.models.random import write_random_model
from tests.gpu.common import record, rel

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=[("llama", "float16"), ("qwen3", "float16")])
def model(request, tmp_path_factory):
    kind, dtype = request.param
    d = tmp_path_factory.mktemp("prefill") / f"{kind}-{dtype}"
    write_random_model(d, kind, num_hidden_layers=2, dtype=dtype)
    return d


def _prompts(seed: int):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 80, 11), rng.integers(0, 80, 4)]


@pytest.mark.parametrize("chunk", [1, 3, 7, 256])
def test_chunked_prompts_against_float64_and_token_steps(model, chunk):
    prompts = _prompts(chunk)
    gpu = Decoder.from_pretrained(model, batch=2, max_seq=32)
    got = gpu.prefill(prompts, chunk=chunk).get()
    ref = HostDecoder.from_pretrained(model, batch=2, max_seq=32, precise=True).prefill(prompts)
    steps = Decoder.from_pretrained(model, batch=1, max_seq=32)
    errs = []
    for b, p in enumerate(prompts):
        one = generate(steps, p, 1, prefill=False, keep_logits=True).logits[len(p) - 1][0]
        errs += [rel(got[b], ref[b]), rel(got[b], one)]
    record("prefill", f"{model.name} chunk {chunk}", f"max err {max(errs):.1e}")
    assert np.isfinite(got).all() and max(errs) <= 1e-2


def test_decoding_goes_on_after_a_chunked_prompt(model):
    p = np.random.default_rng(5).integers(0, 80, (2, 9))
    dec = Decoder.from_pretrained(model, batch=2, max_seq=32)
    a = generate(dec, p, 6, prefill=False)
    b = generate(dec, p, 6)             # chunked by default
    record("prefill", f"{model.name} decode after prefill",
           "same tokens" if np.array_equal(a.tokens, b.tokens) else "differs")
    assert np.array_equal(a.tokens, b.tokens)


def precompile() -> None:
    """The decoders of these tests into the cubin cache (their chunk graphs have no kernels of
    fusionc's own: library calls)."""
    import tempfile
    from pathlib import Path

    from fusionc.models.config import load_config
    for kind in ("llama", "qwen3"):
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / kind
            write_random_model(d, kind, num_hidden_layers=2, dtype="float16")
            cfg = load_config(d)
        for batch in (1, 2):
            Decoder(cfg, batch=batch, max_seq=32)
