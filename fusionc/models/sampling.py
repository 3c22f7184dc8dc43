"""Choosing the next token from the logits: greedy, or temperature with nucleus (top-p)
sampling (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", §3.1)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fusionc.errors import InputError


@dataclass(frozen=True)
class Sampling:
    """``temperature`` 0 is greedy (argmax); otherwise softmax(logits / temperature) restricted
    to the smallest set of most likely tokens whose probability reaches ``top_p``. ``seed``
    makes the draws reproducible."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not self.temperature >= 0 or not 0 < self.top_p <= 1:
            raise InputError(f"temperature {self.temperature}, top_p {self.top_p}",
                             valid="temperature >= 0 (0 = greedy) and 0 < top_p <= 1")

    def rng(self) -> np.random.Generator:
        """A fresh generator for one generation."""
        return np.random.default_rng(self.seed)


def sample(logits, sampling: Sampling, rng: np.random.Generator) -> np.ndarray:
    """One token id per row of ``logits [B, vocab]`` (numpy or CuPy, fp32); int32 numpy ``[B]``.

    Greedy argmax runs where the logits are (on the GPU for CuPy); sampling copies them to the
    host and draws in float64.
    """
    if sampling.temperature == 0:
        ids = logits.argmax(axis=1)
        return np.asarray(ids.get() if hasattr(ids, "get") else ids, np.int32)
    z = np.asarray(logits.get() if hasattr(logits, "get") else logits, np.float64)
    z = z / sampling.temperature
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    out = np.empty(len(p), np.int32)
    for b, row in enumerate(p):
        order = np.argsort(-row, kind="stable")
        keep = int(np.searchsorted(np.cumsum(row[order]), sampling.top_p)) + 1
        kept = order[:keep]
        out[b] = kept[rng.choice(len(kept), p=row[kept] / row[kept].sum())]
    return out
