"""Linear layers on design v2: streamed persistent kernels over every SM.

``@linear`` is ``y = x·Wᵀ`` for one weight (the Llama-3-8B MLP down projection's shape, 4096 ×
14336, by default); ``@qkv_bias`` adds a bias (Qwen2's fused QKV projection); ``@chain`` is two
linear layers in a row (the second reads the first's output: two kernels up to 8 batch rows, one
kernel of two phases above, ``fusionc.lower.match_v2.chains``). Each kernel's grid is every
resident CTA of the GPU: the weight is cut into 64-row × 256-byte tiles, streamed through a
shared-memory ring by TMA bulk copies, on tensor cores from 1 batch row
(``fusionc/lower/linear_v2.py``, ``fusionc/passes/stream.py``).

    fusionc compile examples/linear_v2.py -o /tmp/lin --lowering v2 --max-batch 4
    fusionc ir examples/linear_v2.py --lowering v2 --after insert-barriers -D n=256 -D k=512
    fusionc run examples/linear_v2.py --lowering v2 --batch 4        # on the GPU
"""
import fusionc as fc


def build(n: int = 4096, k: int = 14336, n2: int = 1024, dtype: str = "f16") -> fc.ir.Module:
    """Graphs ``@linear`` (y = x·Wᵀ), ``@qkv_bias`` (with a bias) and ``@chain`` (two linears)."""
    T = fc.dtype(dtype)

    @fc.graph
    def linear(x: T["B", k], w: T[n, k]):
        return fc.linear(x, w, name="y")

    @fc.graph
    def qkv_bias(x: T["B", k], w: T[n, k], bias: T[n]):
        return fc.linear(x, w, bias, name="qkv")

    @fc.graph
    def chain(x: T["B", k], w1: T[n, k], w2: T[n2, n]):
        return fc.linear(fc.linear(x, w1, name="h"), w2, name="y")

    return fc.module(linear, qkv_bias, chain)
