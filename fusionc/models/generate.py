"""Token generation with a :class:`fusionc.models.decoder.Decoder`: the prompt runs in chunks
(``decoder.prefill``) or through the decode step one token at a time, then each step's sampled
token is fed back."""
from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field

import numpy as np

from fusionc.errors import InputError
from fusionc.models.sampling import Sampling, sample


@dataclass
class Generation:
    """The result of :func:`generate`: ``tokens [batch, new]`` (int), wall-clock milliseconds of
    the prompt steps and per generated token (decode step + sampling + host round trip)."""

    tokens: np.ndarray
    prompt_ms: float
    ms_per_token: float
    logits: list = field(default_factory=list, repr=False)


def generate(decoder, prompt, max_new_tokens: int, sampling: Sampling = Sampling(), *,
             keep_logits: bool = False, prefill: bool | None = None) -> Generation:
    """Generate ``max_new_tokens`` tokens after ``prompt`` for every sequence of the batch.

    Args:
        decoder: a Decoder (GPU) or HostDecoder (CPU), fresh or reused (the KV cache is
            overwritten from position 0).
        prompt: token ids ``[n]`` (the same prompt for every row) or ``[batch, n]``.
        max_new_tokens: >= 1; prompt length + max_new_tokens - 1 <= the decoder's max_seq.
        sampling: greedy by default.
        keep_logits: also return each step's logits (host fp32 ``[batch, vocab]``, prompt steps
            included) in ``Generation.logits``.
        prefill: the prompt in chunks (``decoder.prefill``, where ``decoder.prefills``: the GPU
            and CPU decoders) rather than one decode step per token; default: chunks unless
            ``keep_logits`` asks for every prompt step's logits.
    Raises:
        InputError: an empty prompt, too many tokens for the KV cache, ids outside the vocab.
    """
    if not isinstance(sampling, Sampling):
        raise InputError(f"sampling = {sampling!r}", valid="a fusionc.models.Sampling")
    p = _prompt(prompt, decoder.batch)
    if not isinstance(max_new_tokens, numbers.Integral) or isinstance(max_new_tokens, bool) or \
            max_new_tokens < 1 or p.shape[1] + max_new_tokens - 1 > decoder.max_seq:
        raise InputError(f"{p.shape[1]} prompt + {max_new_tokens} new tokens",
                         valid=f"max_new_tokens >= 1 and a total <= max_seq + 1 = "
                               f"{decoder.max_seq + 1}")
    rng, kept = sampling.rng(), []
    if prefill is None:
        prefill = getattr(decoder, "prefills", False) and not keep_logits
    if prefill and not getattr(decoder, "prefills", False):
        raise InputError(f"prefill with a {type(decoder).__name__}",
                         valid="prefill=False (this decoder steps through prompts token by "
                               "token), or a fusionc Decoder / HostDecoder")
    t0 = time.perf_counter()
    if prefill:
        logits = decoder.prefill(list(p))
        kept.append(_host(logits) if keep_logits else None)
    for t in range(0 if prefill else p.shape[1]):
        logits = decoder.step(p[:, t], np.full(decoder.batch, t))
        kept.append(_host(logits) if keep_logits else None)
    nxt = sample(logits, sampling, rng)
    t1 = time.perf_counter()
    out = [nxt]
    for t in range(p.shape[1], p.shape[1] + max_new_tokens - 1):
        logits = decoder.step(out[-1], np.full(decoder.batch, t))
        kept.append(_host(logits) if keep_logits else None)
        out.append(sample(logits, sampling, rng))
    t2 = time.perf_counter()
    return Generation(np.stack(out, axis=1), 1e3 * (t1 - t0),
                      1e3 * (t2 - t1) / max(1, max_new_tokens - 1),
                      kept if keep_logits else [])


def _prompt(prompt, batch: int) -> np.ndarray:
    """Token ids ``[batch, n]`` from ``[n]`` (shared) or ``[batch, n]``; InputError otherwise."""
    valid = f"a non-empty [n] or [{batch}, n] list of integer token ids"
    try:
        p = np.asarray(prompt)
    except ValueError:   # ragged nested lists
        raise InputError("a ragged prompt", valid=valid) from None
    if p.ndim == 1:
        p = p[None, :].repeat(batch, axis=0)
    if p.ndim != 2 or p.shape[0] != batch or p.shape[1] == 0 or p.dtype.kind not in "iu":
        raise InputError(f"prompt {prompt!r:.80}", valid=valid)
    return p


def _host(logits) -> np.ndarray:
    return np.array(logits.get() if hasattr(logits, "get") else logits, np.float32)
