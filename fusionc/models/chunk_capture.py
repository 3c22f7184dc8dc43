"""Captured prompt chunks (issue 25): every layer's pass over a full chunk, replayed from a CUDA
graph. A chunk's graphs run on the library path, a dozen host ops a layer (~1 ms of host time
per layer and chunk on the GPU machine's host, BENCHMARKS.md eleventh session), so a chunk was
host-bound; a replay costs one launch. Each chunk length gets one capture, made on the first
chunk of that length: an eager pass on the decoder's stream (its result is that chunk's; it
also creates the stream's cuBLAS handle), then the same pass captured. Every value a kernel
reads that changes from chunk to chunk (the hidden states, positions, sequence map) is a static
buffer the chunk is copied into before the replay; the KV caches are the decoder's own.

The capture allocates from a memory pool of its own, kept with the graph: blocks freed during
the capture are reused only by later ops of the same capture (stream order), never handed to
anyone else while the graph lives. The rows were checked by the decoder (they come from
:func:`fusionc.models.prefill.chunks`): a replay checks nothing.
"""
from __future__ import annotations

import warnings

import numpy as np


class ChunkGraph:
    """One captured pass of ``layers(x, seq_of, positions, host)`` (the decoder's layers over
    a chunk; ``host``: the positions and sequence map on the host) for chunks of the rows of
    ``x`` on CuPy stream ``stream``. :attr:`first` is the eager pass's result (the capturing
    chunk's hidden states); :meth:`run` replays for another chunk of the same length."""

    def __init__(self, layers, x, seq_of, positions, stream):
        import cupy
        self.stream, self.pool = stream, cupy.cuda.MemoryPool()
        self.x = cupy.empty_like(x)
        self.seq_of = cupy.empty(len(seq_of), cupy.int32)
        self.positions = cupy.empty(len(positions), cupy.int32)
        host = self._fill(x, seq_of, positions)
        with stream:
            self.first = layers(self.x, self.seq_of, self.positions, host)
            self.graph = self.error = None
            with cupy.cuda.using_allocator(self.pool.malloc):
                stream.begin_capture()
                try:
                    self.out = layers(self.x, self.seq_of, self.positions, host)
                except BaseException as e:   # the stream must not stay capturing
                    try:
                        stream.end_capture()
                    except Exception:  # noqa: S110 - the first error is the one reported
                        pass
                    if not isinstance(e, Exception):
                        raise
                    self.error = e   # this chunk's result is the eager pass's; later ones
                    warnings.warn(   # of this length run eagerly (slower, still correct)
                        f"fusionc: a prompt chunk of {len(x)} rows could not be captured in a "
                        f"CUDA graph ({type(e).__name__}: {e}); chunks of that length run "
                        "eagerly", RuntimeWarning, stacklevel=3)
                else:
                    self.graph = stream.end_capture()

    def _fill(self, x, seq_of, positions) -> dict:
        """Copy a chunk into the static buffers (on the stream, after what it waits for)."""
        host = {"seq_of": np.asarray(seq_of, np.int32),
                "positions": np.asarray(positions, np.int32)}
        with self.stream:
            self.x[...] = x
            self.seq_of.set(host["seq_of"], stream=self.stream)
            self.positions.set(host["positions"], stream=self.stream)
        return host

    def run(self, x, seq_of, positions):
        """The layers over another chunk of this length: the static output (overwritten by
        the next replay; copy what must outlive it)."""
        self._fill(x, seq_of, positions)
        self.graph.launch(self.stream)
        return self.out
