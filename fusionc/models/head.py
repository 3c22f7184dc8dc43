"""The parts of a decode step around the fused layer kernels, on the GPU: token embedding (a
gather), the final RMSNorm and the LM head (a cuBLAS GEMM with fp32 accumulation and fp32
logits). These are library calls (CuPy, cuBLAS), not fusionc kernels; each writes into buffers
allocated once. The embedding and the norm are captured with the layers in the step's CUDA
graph; CuPy refuses cuBLAS calls during a capture, so the GEMM runs after each replay.

Storage dtypes as in ``fusionc.runtime.arrays``: f16 arrays are float16, bf16 arrays are uint16
bit patterns, f32 arrays float32.
"""
from __future__ import annotations

import numpy as np

from fusionc.runtime.library import _GEMM_DEFAULT
from fusionc.runtime.library import CUDA_R as _CUDA_R
from fusionc.runtime.library import norm_kernels as _kernels


class Head:
    """Final RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4) and
    LM head for a batch of ``batch`` rows.

    Args:
        final_norm: ``[hidden]``, lm_head: ``[vocab, hidden]`` device arrays of ``dtype``.
        eps: RMSNorm epsilon.
        batch: rows of the hidden state (the decoder's batch).
        dtype: storage dtype, f16 or bf16 (bf16 arrays hold uint16 bit patterns).
    Call ``head(x)`` with ``x [batch, hidden]``; returns the fp32 logits ``[batch, vocab]``
    buffer (overwritten by the next call).
    """

    def __init__(self, final_norm, lm_head, eps: float, batch: int, dtype: str):
        import cupy
        self.w, self.lm_head, self.eps, self.dtype = final_norm, lm_head, eps, dtype
        vocab, hidden = lm_head.shape
        self.normed = cupy.empty((batch, hidden), lm_head.dtype)
        self.sumsq = cupy.empty((batch, 1), cupy.float32)
        self.logits = cupy.empty((batch, vocab), cupy.float32)
        self._scalars = np.array([1.0, 0.0], np.float32)  # alpha, beta (host pointer mode)

    def norm(self, x) -> None:
        """``normed = rms_norm(x) · final_norm`` (fp32 arithmetic, rounded to the dtype)."""
        sumsq, scale = _kernels(self.dtype)
        sumsq(x, axis=1, keepdims=True, out=self.sumsq)
        scale(x, self.w[None, :], self.sumsq, np.float32(x.shape[1]), np.float32(self.eps),
              self.normed)

    def project(self):
        """``logits = normed · lm_headᵀ`` in fp32 (cublasGemmEx, 16-bit inputs, fp32 compute and
        output) on the current stream; returns the logits buffer."""
        import cupy
        from cupy_backends.cuda.libs import cublas
        handle = cupy.cuda.device.get_cublas_handle()
        cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        vocab, hidden = self.lm_head.shape
        t = _CUDA_R[self.dtype]
        a = self._scalars.ctypes.data
        # column-major: logits^T [vocab, B] = lm_head [vocab, hidden] · normed^T [hidden, B]
        cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, vocab,
                      self.normed.shape[0], hidden, a, self.lm_head.data.ptr, t, hidden,
                      self.normed.data.ptr, t, hidden, a + 4, self.logits.data.ptr,
                      _CUDA_R["f32"], vocab, cublas.CUBLAS_COMPUTE_32F, _GEMM_DEFAULT)
        return self.logits

    def __call__(self, x):
        """:meth:`norm` then :meth:`project`."""
        self.norm(x)
        return self.project()


def embed_into(embed, tokens, out) -> None:
    """``out[b] = embed[tokens[b]]`` (``embed [vocab, hidden]``, ``tokens i32[B]``)."""
    import cupy
    cupy.take(embed, tokens, axis=0, out=out)
