"""Graphs of norm, linear and elementwise ops on design v2 — each linear is one streamed kernel
that absorbs the norm before it and the elementwise ops after it (``fusionc/lower/match_v2.py``).

- ``@swiglu``: ``silu(linear(h, wg)) * linear(h, wu)`` with separate gate and up weights: two
  kernels; the first ends in ``silu``, the second multiplies by the first's output in its flush.
- ``@norm_silu``: RMSNorm → linear → SiLU in one kernel: every CTA computes the rows' 1/rms
  itself, gamma scales the activation tiles, the row scale and SiLU run in the flush.
- ``@mlp``: the Llama MLP block as ``fusionc.models.blocks`` writes it (fused ``w_gate_up`` +
  ``split``); above 8 batch rows (``v2_pipeline``'s default) one persistent kernel of two phases — paired gate/up tiles with the SwiGLU
  epilogue, whose flushes signal a counter per K chunk of the down projection, then the down
  projection (its producer waits on the chunks it reads) with the residual add in its flush.
- ``@mlp_shard``: one tensor-parallel rank's MLP shard (no norm prologue, no residual: the
  all-reduce adds the ranks' partial sums).
- ``@linear`` and ``@chain``: a lone linear, and two chained linears with a bias and a cast
  (one kernel of two phases, like the MLP).
- ``@heads``: a projection viewed as 4 heads (``split_heads``), SiLU on the heads, merged back
  (``merge_heads``) into the next linear: ``fold-views`` moves the views past the SiLU and
  cancels them, so this is ``@chain``'s kernel with a SiLU epilogue.
- ``@lm_head``: the final RMSNorm and an LM head whose logits are the fp32 sums, unrounded
  (``out_dtype = f32``): one kernel, its flush stores fp32.

    fusionc ir examples/graphs_v2.py --lowering v2 --after partition-units -D hidden=256 -D inter=200 \
        --max-batch 16
    fusionc run examples/graphs_v2.py --lowering v2 --graph mlp --batch 4     # on the GPU
"""
import fusionc as fc


def build(hidden: int = 4096, inter: int = 14336, dtype: str = "bf16") -> fc.ir.Module:
    """The graphs above for a model of ``hidden`` × ``inter`` (Llama-3-8B by default)."""
    T = fc.dtype(dtype)

    @fc.graph
    def swiglu(h: T["B", hidden], wg: T[inter, hidden], wu: T[inter, hidden]):
        return fc.silu(fc.linear(h, wg, name="gate")) * fc.linear(h, wu, name="up")

    @fc.graph
    def norm_silu(x: T["B", hidden], g: T[hidden], w: T[inter, hidden]):
        return fc.silu(fc.linear(fc.rms_norm(x, g, 1e-5, name="h"), w, name="y"))

    @fc.graph
    def mlp(x: T["B", hidden], mlp_norm: T[hidden], w_gate_up: T[2 * inter, hidden],
            w_down: T[hidden, inter]):
        h = fc.rms_norm(x, mlp_norm, 1e-5, name="h")
        gate, up = fc.split(fc.linear(h, w_gate_up, name="gate_up"), [inter, inter],
                            name=("gate", "up"))
        return x + fc.linear(fc.silu_mul(gate, up, name="act"), w_down, name="down")

    @fc.graph
    def mlp_shard(h: T["B", hidden], w_gate_up: T[inter, hidden],
                  w_down: T[hidden, inter // 2]):
        gate, up = fc.split(fc.linear(h, w_gate_up, name="gate_up"), [inter // 2, inter // 2],
                            name=("gate", "up"))
        return fc.linear(fc.silu(gate) * up, w_down, name="partial")

    @fc.graph
    def linear(x: T["B", hidden], w: T[inter, hidden]):
        return fc.linear(x, w, name="y")

    @fc.graph
    def chain(x: T["B", hidden], w1: T[inter, hidden], b1: T[inter], w2: T[hidden, inter]):
        h = fc.linear(x, w1, b1, name="h")
        return fc.cast(fc.linear(h, w2, name="y"), "f32")

    @fc.graph
    def heads(x: T["B", hidden], w1: T[inter, hidden], w2: T[hidden, inter]):
        h = fc.split_heads(fc.linear(x, w1, name="h"), 4, name="hh")
        return fc.linear(fc.merge_heads(fc.silu(h, name="a"), name="m"), w2, name="y")

    @fc.graph
    def lm_head(x: T["B", hidden], g: T[hidden], w: T[inter, hidden]):
        h = fc.rms_norm(x, g, 1e-5, name="h")
        return fc.linear(h, w, out_dtype=fc.f32, name="logits")

    return fc.module(swiglu, norm_silu, mlp, mlp_shard, linear, chain, heads, lm_head)
