"""Which attention cores share one streamed kernel with their output projection
(``partition-units{attention_o}``, issue 24): the core's ``attn_units`` op runs as the
kernel's attention phase, on its consumer warps, while the producer warp already streams the
projection's first weight stages; the projection's units then wait for one signal per CTA
(:func:`fusionc.lower.linear_v2.lower_chain` with ``attention``). One kernel boundary less
per layer: the projection's launch, ring fill and tail (BENCHMARKS.md, twelfth session: the
O projection took 16 µs a layer for 19 MB of weights, Llama-3.2-3B, batch 1)."""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.ir.kernel import SMEM_LIMIT
from fusionc.ir.nodes import Graph, Op


@dataclass(frozen=True)
class FusedBlock:
    """One attention core's kernel with its projections: ``specs`` the linears (the QKV
    projection if taken, then the output projection), ``attention`` the core's op, ``rows``
    the weight rows of the kernel's tiles."""

    attention: Op
    specs: tuple
    rows: int


def fused_attention(g: Graph, cores: dict, specs: dict, chain_of: dict, fits,
                    qkv: bool = True) -> dict:
    """id(output projection) → :class:`FusedBlock` for the attention cores of ``g`` that share
    one streamed kernel with their output projection (``partition-units{attention_o}``,
    :func:`fusionc.lower.linear_v2.lower_chain`) and, with ``qkv``
    (``partition-units{attention_qkv}``), their QKV projection too. The output projection is
    the one linear of its chain, reads ``o_flat`` with no RMSNorm before it (and not in its
    epilogue) and comes right after the core (no op in between that the core does not
    absorb); the QKV projection is the
    one linear of its chain, writes the core's ``qkv`` and has only the core's ops between it
    and the attention. The core's units run on the kernel's 256 consumer threads
    (:func:`fusionc.lower.attention_v2.threads`: head_dim <= 128, 16-bit); ``fits(core,
    specs)``: the weight rows of tiles whose ring of at least two stages fits beside the
    attention's shared memory (:func:`fits_two_stages`), or 0; the QKV projection is left out
    where only the output projection fits."""
    from fusionc.lower.attention_v2 import AttentionCore, threads
    out, pos = {}, {id(op): i for i, op in enumerate(g.body)}
    for att, core in cores.items():
        if not isinstance(core, AttentionCore):
            continue
        kc = core.caches[0].type
        o = _only([k for k in specs.values() if k.xin.name == core.out.name], chain_of)
        if o is None or o.norm is not None or threads(kc.shape[3], kc.dtype) != 256 or \
                not _inside(g.body[pos[att] + 1:pos[id(o.linear)]], core) or \
                core.out.name in _epilogue_reads(o):
            continue
        q = _only([k for k in specs.values() if k.out.name == core.qkv.name], chain_of)
        if q is not None and not _inside(g.body[pos[id(q.linear)] + 1:pos[att]], core):
            q = None
        for taken in ((q, o), (o,)) if qkv and q is not None else ((o,),):
            rows = fits(core, list(taken))
            if rows:
                out[id(o.linear)] = FusedBlock(core.attention, taken, rows)
                break
    return out


def _epilogue_reads(spec) -> set:
    """Names of the tensors a linear kernel's epilogue reads (its bias, its steps' operands):
    those are read with plain loads by every CTA, so they cannot be a value the kernel's
    attention phase writes."""
    op = spec.linear
    return {t.name for _, t in spec.steps if t is not None} | \
        ({op.operands[2].name} if len(op.operands) == 3 else set())


def _only(found: list, chain_of: dict):
    """The one linear kernel of ``found`` if it is a chain of its own, else None."""
    return found[0] if len(found) == 1 and len(chain_of[id(found[0].linear)]) == 1 else None


def _inside(ops, core) -> bool:
    """Whether every op of ``ops`` is absorbed by attention core ``core``."""
    absorbed = {id(o) for o in core.absorbed}
    return all(id(o) in absorbed for o in ops)


def launch_values(k: Graph, core) -> tuple[tuple, list]:
    """(the launch's results, its operands) of kernel ``k``: its outputs (an attention core's
    caches as the core's appended results), and its parameters other than pure outputs."""
    res = {c.name: r for c, r in zip(core.caches, core.results)} if core is not None else {}
    outs = tuple(res.get(v.name, v) for v in k.outputs)
    pure = {v.name for v in k.outputs} - set(res)   # allocated by the runtime: not operands
    return outs, [v for v in k.params if v.name not in pure]


def fits_two_stages(k: Graph) -> bool:
    """Whether streamed kernel ``k`` takes its tiles through a ring (TMA rows) of two stages
    that fits in shared memory with the rest of the kernel's (smem-plan's test)."""
    from fusionc.codegen.streamed import plan
    from fusionc.passes.stream import StreamPlan
    k2 = StreamPlan(stages=2).plan(k)
    return any(op.name == "ring_alloc" for op in k2.body) and \
        plan(k2, check=False).smem + 1024 <= SMEM_LIMIT
