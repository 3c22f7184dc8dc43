"""Choosing the next token from the logits: greedy, or temperature with nucleus (top-p)
sampling (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", §3.1)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from fusionc.errors import InputError, NumericsError


@dataclass(frozen=True)
class Sampling:
    """``temperature`` 0 is greedy (argmax); otherwise softmax(logits / temperature) restricted
    to the smallest set of most likely tokens whose probability reaches ``top_p``. ``seed``
    makes the draws reproducible."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        real = lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)  # noqa: E731
        if not real(self.temperature) or not 0 <= self.temperature < math.inf:
            raise InputError(f"temperature {self.temperature!r}",
                             valid="a finite temperature >= 0 (0 = greedy)")
        if not real(self.top_p) or not 0 < self.top_p <= 1:
            raise InputError(f"top_p {self.top_p!r}", valid="0 < top_p <= 1")
        if not isinstance(self.seed, numbers.Integral) or isinstance(self.seed, bool) or \
                self.seed < 0:
            raise InputError(f"seed {self.seed!r}", valid="an integer seed >= 0")

    def rng(self) -> np.random.Generator:
        """A fresh generator for one generation."""
        return np.random.default_rng(self.seed)


def sample(logits, sampling: Sampling, rng: np.random.Generator) -> np.ndarray:
    """One token id per row of ``logits [B, vocab]`` (numpy or CuPy, fp32); int32 numpy ``[B]``.

    Greedy argmax runs where the logits are (on the GPU for CuPy); sampling copies them to the
    host and draws in float64. Raises NumericsError when a logit is NaN or infinite.
    """
    if bool(logits.shape[1] and (~(abs(logits) < np.inf)).any()):
        raise NumericsError("the logits contain NaN or infinity", valid="finite logits (check "
                            "the weights for NaN/Inf, and the dtype's range)")
    if sampling.temperature == 0:
        ids = logits.argmax(axis=1)
        return np.asarray(ids.get() if hasattr(ids, "get") else ids, np.int32)
    z = np.asarray(logits.get() if hasattr(logits, "get") else logits, np.float64)
    z = (z - z.max(axis=1, keepdims=True)) / sampling.temperature   # <= 0: no overflow
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    out = np.empty(len(p), np.int32)
    for b, row in enumerate(p):
        order = np.argsort(-row, kind="stable")
        keep = int(np.searchsorted(np.cumsum(row[order]), sampling.top_p)) + 1
        kept = order[:keep]
        out[b] = kept[rng.choice(len(kept), p=row[kept] / row[kept].sum())]
    return out
