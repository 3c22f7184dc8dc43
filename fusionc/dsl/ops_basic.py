"""DSL ops for the dense parts of a decoder layer: elementwise, RMSNorm, linear, shapes.

Every function records one graph-IR op (see ``fusionc/ir/ops``) on the graph being traced and
returns traced tensors. Operands share one dtype (f16, bf16 or f32; no implicit casts — use
:func:`cast`); arithmetic is fp32 with the result rounded to the operand dtype. ``name=`` names
the result in the IR (default ``%0, %1, ...``).
"""
from __future__ import annotations

from fusionc.dsl.builder import emit
from fusionc.dsl.source import user_loc
from fusionc.dsl.spec import to_dtype
from fusionc.dsl.tensor import Tracer
from fusionc.errors import DSLError


def add(a: Tracer, b: Tracer, *, name: str | None = None) -> Tracer:
    """y = a + b, elementwise (residual connections); also written ``a + b``.

    a, b: same shape and dtype (no broadcasting). Returns that type.
    """
    return emit("add", (a, b), name=name)[0]


def mul(a: Tracer, b: Tracer, *, name: str | None = None) -> Tracer:
    """y = a · b, elementwise; also written ``a * b``. a, b: same shape and dtype."""
    return emit("mul", (a, b), name=name)[0]


def silu(x: Tracer, *, name: str | None = None) -> Tracer:
    """y = x · sigmoid(x) (SiLU / swish; Hendrycks & Gimpel 2016). Any shape, float dtype."""
    return emit("silu", (x,), name=name)[0]


def silu_mul(gate: Tracer, up: Tracer, *, name: str | None = None) -> Tracer:
    """SwiGLU gate: y = silu(gate) · up (Shazeer 2020, "GLU Variants Improve Transformer",
    eq. 6; the Llama MLP). gate, up: ``[B, intermediate]``, same dtype. Returns that type."""
    return emit("silu_mul", (gate, up), name=name)[0]


def rms_norm(x: Tracer, weight: Tracer, eps: float, *, name: str | None = None) -> Tracer:
    """RMSNorm over the last axis: y = weight · x · rsqrt(mean(x², last axis) + eps).

    Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4, with eps inside the
    root as in Llama. The sum of squares is accumulated in fp32 (fp16 inputs whose squares
    overflow fp16 are fine).

    Args:
        x: ``[..., D]`` — ``[B, hidden]`` for the hidden state, ``[B, heads, head_dim]`` for
            per-head QK-norm (Qwen3).
        weight: ``[D]``, dtype of x.
        eps: >= 0 (Llama 2/3: 1e-5, Qwen3: 1e-6).
    Returns:
        ``[..., D]`` in the dtype of x.
    """
    return emit("rms_norm", (x, weight), {"eps": eps}, name)[0]


def linear(x: Tracer, w: Tracer, bias: Tracer | None = None, *, out_dtype=None,
           name: str | None = None) -> Tracer:
    """y[..., n] = Σ_k x[..., k] · w[n, k] (+ bias[n]): ``torch.nn.Linear`` (weights [out, in]).

    Args:
        x: ``[..., in]`` (``[B, in]`` in decode: a GEMV per token).
        w: ``[out, in]``, dtype of x.
        bias: optional ``[out]``.
        out_dtype: the result's dtype (``fusionc.f32``, ``"bf16"``, ...; default the dtype of
            x): ``f32`` keeps the fp32 sums unrounded, as an LM head's logits.
    Returns:
        ``[..., out]``; products accumulated in fp32, rounded to ``out_dtype``.
    """
    operands = (x, w) if bias is None else (x, w, bias)
    attrs = {} if out_dtype is None else {"out_dtype": to_dtype(out_dtype).value}
    return emit("linear", operands, attrs, name=name)[0]


def embedding(table: Tracer, tokens: Tracer, *, name: str | None = None) -> Tracer:
    """y[b] = table[tokens[b]]: the rows of the token ids (``torch.nn.Embedding``).

    Args:
        table: ``[vocab, hidden]``; tokens: ``i32[B]``, each in ``[0, vocab)`` (checked when
            the graph runs).
    Returns:
        ``[B, hidden]``, dtype of the table (the rows as they are).
    """
    return emit("embedding", (table, tokens), name=name)[0]


def reshape(x: Tracer, *shape, name: str | None = None) -> Tracer:
    """x viewed with another row-major shape of the same size (no data moves on the GPU).

    ``reshape(x, "B", 32, 128)`` or ``reshape(x, ("B", 32, 128))``. Symbolic dims (``"B"``)
    must be kept as they are; static dims may be regrouped.
    """
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return emit("reshape", (x,), {"shape": tuple(shape)}, name)[0]


def split(x: Tracer, sizes, axis: int = -1, *, name=None) -> tuple[Tracer, ...]:
    """Consecutive slices of x along ``axis`` with the given ``sizes`` (summing to that dim).

    E.g. q, k, v out of a fused QKV projection ``[B, (H + 2·Hkv)·D]``. ``name`` may be one
    name (results ``name.0, name.1, ...``) or one name per part.
    """
    if isinstance(axis, int) and not isinstance(axis, bool) and isinstance(x, Tracer):
        axis = axis % x.ndim if -x.ndim <= axis < x.ndim else axis
    sizes = tuple(sizes) if isinstance(sizes, (tuple, list)) else sizes
    return emit("split", (x,), {"axis": axis, "sizes": sizes}, name)


def split_heads(x: Tracer, heads: int, *, name: str | None = None) -> Tracer:
    """``[..., heads·head_dim]`` → ``[..., heads, head_dim]`` (a reshape)."""
    last = x.shape[-1] if isinstance(x, Tracer) and x.ndim else None
    if not isinstance(heads, int) or not isinstance(last, int) or heads < 1 or last % heads:
        raise DSLError(f"cannot split {getattr(x, 'type', x)} into {heads!r} heads",
                       op="split_heads", loc=user_loc(),
                       valid="a static last dim that is a multiple of heads")
    return reshape(x, *x.shape[:-1], heads, last // heads, name=name)


def merge_heads(x: Tracer, *, name: str | None = None) -> Tracer:
    """``[..., heads, head_dim]`` → ``[..., heads·head_dim]`` (a reshape)."""
    if not isinstance(x, Tracer) or x.ndim < 2 or not all(isinstance(d, int)
                                                          for d in x.shape[-2:]):
        raise DSLError(f"cannot merge the heads of {getattr(x, 'type', x)}",
                       op="merge_heads", loc=user_loc(),
                       valid="a tensor [..., heads, head_dim] with static heads and head_dim")
    return reshape(x, *x.shape[:-2], x.shape[-2] * x.shape[-1], name=name)


def cast(x: Tracer, dtype, *, name: str | None = None) -> Tracer:
    """x converted to ``dtype`` (``"f16"``, ``fusionc.bf16``, ...; round to nearest even)."""
    return emit("cast", (x,), {"dtype": to_dtype(dtype).value}, name)[0]
