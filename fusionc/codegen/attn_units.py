"""CUDA of an attention-units kernel (``attn_units``, :mod:`fusionc.ir.ops.tile_attn_units`):
``templates/attn_units.cu.j2``.

Launch: min(the op's ``grid``, the CTAs resident at once: ``persistent_units``) CTAs of the
kernel's threads (eight warps, four for head_dim > 128), no cluster; arguments: the kernel's
tensors in parameter order, the symbolic dims, the partial slots (``fc_ws``:
:func:`fusionc.ir.ops.tile_attn_units.slots` × GU·(D + 2) floats, GU the query heads of one
block) and per (row, KV head, query block) an arrival counter of its units (``fc_counters``,
left zero by every launch: the last unit merges and resets it), then the error word of the streamed kernels' interface
(``LoadedKernel.errors()``; nothing here waits, so it stays 0).
PDL (:mod:`fusionc.codegen.pdl`): every CTA waits for the previous kernel before it reads
anything and lets the next one start once its units are done.
"""
from __future__ import annotations

import numpy as np

import fusionc
from fusionc.codegen import cnames, libs
from fusionc.codegen.render import render
from fusionc.codegen.source import KernelSource
from fusionc.errors import CompileError
from fusionc.ir.nodes import Graph, Op
from fusionc.ir.types import DType
from fusionc.ir.ops.rope import inv_freq
from fusionc.ir.kernel import SMEM_LIMIT
from fusionc.ir.ops.tile_attn_units import (MAX_SPLITS, UNIT_OVERHEAD, WAVES, block_rows,
                                           q_blocks, slots)
from fusionc.ir.printer import print_graph

MAX_STAGES = 3    # cp.async stages per warp (2 at least)
QREGS_MAX_D = 128   # q's mma A fragments stay in registers (4·D/16 per lane) up to this head_dim


def attn_op(kernel: Graph) -> Op | None:
    """The kernel's ``attn_units`` op, if it is an attention-units kernel."""
    return next((op for op in kernel.body if op.name == "attn_units"), None)


def ring_fit(head_dim: int, itemsize: int, group: int, threads: int,
             max_batch: int = 1, stages: int | None = None) -> tuple[int, int]:
    """(cp.async stages per warp, shared-memory bytes) of the template's layout for a group of
    ``group`` query heads per KV head: the warps' rings ([W][stages][32 rows][D + 8]), the q
    rows ([16][D + 8]), the new k and v, fp32 q/k/v, m/l, RoPE's cos and sin (D), the plan's
    sums (2 · WAVES + W) and the unit prefix (4 B a row). Fewer than 2 stages: it does not fit
    (the default lowering asks this too: ``fusionc.lower.attention_v2.covers``). ``stages``:
    that many, not as many as fit (an attention phase: :data:`PHASE_STAGES`)."""
    d, warps, gu = head_dim, threads // 32, block_rows(group)
    step = 2 * 16 * (d + 8) * itemsize
    rest = 16 * (d + 8) * itemsize + 2 * d * itemsize + \
        4 * ((gu + 3) * d + 2 * gu + 2 * WAVES + warps + max_batch + 2)
    if stages is None:
        stages = min(MAX_STAGES, (SMEM_LIMIT - rest) // (warps * step))
    return stages, warps * stages * step + rest


def geometry(op: Op, threads: int, max_batch: int, stages: int | None = None) -> dict:
    """G, D, H, KVH, S of the op, the cp.async stages per warp and the shared-memory bytes of
    the template's layout (:func:`ring_fit`; ``stages`` as there)."""
    kc, o = op.operands[1].type, op.operands[5].type
    _, S, kvh, d = kc.shape
    heads = o.shape[1] // d
    g = heads // kvh
    stages, smem = ring_fit(d, kc.dtype.itemsize, g, threads, max_batch, stages)
    return dict(G=g, GU=block_rows(g), QB=q_blocks(g), D=d, H=heads, KVH=kvh, S=S,
                stages=stages, smem=smem)


def _check(kernel: Graph, op: Op, geo: dict) -> None:
    from fusionc.ir.ops.tile_attn_units import unsupported
    bad = unsupported(op.operands[0].type.dtype, geo["H"], geo["KVH"], geo["D"])
    if geo["stages"] < 2 and not bad and \
            geometry(op, kernel.attr("threads"), 1)["stages"] >= 2:   # the prefix is too big
        bad.append(f"a bucket of {kernel.attr('max_batch')} rows (the unit prefix takes "
                   f"4 B a row of shared memory)")
    elif geo["stages"] < 2 and not bad:   # (f32's rings would not fit either: named above)
        bad.append(f"head_dim {geo['D']} with {kernel.attr('threads')} threads (two "
                   "cp.async stages per warp do not fit in shared memory)")
    if bad:
        raise CompileError("attention units cannot take " + ", ".join(bad), op=op.name,
                           loc=op.loc, valid="f16 or bf16 (f32 at head_dim <= 192), head_dim "
                                             "a multiple of 16, a few thousand rows at most "
                                             "(the mixed path's host attention takes "
                                             "the others)")


def generate_attn_units(kernel: Graph, options=None) -> KernelSource:
    """The CUDA source and launch of an attention-units kernel (module docstring).

    Raises:
        CompileError: a head geometry, batch bucket or dtype the template does not take.
    """
    op = attn_op(kernel)
    threads = kernel.attr("threads")
    mb = kernel.attr("max_batch")
    geo = geometry(op, threads, mb)
    _check(kernel, op, geo)
    params, names, _, name = unit_params(kernel, op)
    source = render(
        "attn_units.cu.j2", version=fusionc.__version__, kernel_name=f"kernel @{kernel.name}",
        ir_lines=print_graph(kernel).splitlines(), name=name,
        libs=libs.render_libs({"mma", "attention", "stream"}),
        params=[kp.decl for kp in params], sync="__syncthreads()",
        **template_vars(op, geo, threads, mb, names)) + "\n"
    w, c = buffers(op, geo, mb)
    return KernelSource(name=name, source=source, kernel=kernel, grid=op.attr("grid"),
                        cluster=1, threads=threads, smem_bytes=geo["smem"], params=tuple(params),
                        workspace_floats=w, counters=c + 1, resident=True,
                        persistent_units=op.attr("grid"), pdl=True)


def buffers(op: Op, geo: dict, max_batch: int) -> tuple[int, int]:
    """(workspace floats, counter words) of the units: a partial slot of GU·(D + 2) floats per
    unit a launch may take (:func:`fusionc.ir.ops.tile_attn_units.slots`) and an arrival
    counter per (row, KV head, query block)."""
    units = geo["KVH"] * geo["QB"]
    return slots(max_batch, units, op.attr("grid")) * geo["GU"] * (geo["D"] + 2), \
        max_batch * units


def template_vars(op: Op, geo: dict, threads: int, max_batch: int, names: list) -> dict:
    """The variables of ``attn_defs.cu.j2`` and ``attn_body.cu.j2`` for ``op`` (geometry
    ``geo``, the C names of its operands ``names``)."""
    dt = op.operands[0].type.dtype
    return dict(
        stages=geo["stages"], T=cnames.ctype(dt), G=geo["G"], GU=geo["GU"], QB=geo["QB"],
        D=geo["D"], H=geo["H"], KVH=geo["KVH"], S=geo["S"], tile=op.attr("tile"),
        grid=op.attr("grid"), threads=threads, max_batch=max_batch, max_splits=MAX_SPLITS,
        wmax=WAVES, c0=UNIT_OVERHEAD, fma=dt == DType.f32,
        qregs=geo["D"] <= QREGS_MAX_D and dt != DType.f32,
        scale=cnames.f32_literal(op.attr("scale")), rot=op.attr("rotary_dim"),
        style=op.attr("style"), inv_freq=freq_literals(op), norm=len(op.operands) == 8,
        eps=repr(float(op.attr("eps"))), qkv=names[0], k_cache=names[1], v_cache=names[2],
        pos=names[3], lens=names[4], o=names[5], q_norm=names[6] if len(names) > 6 else "",
        k_norm=names[7] if len(names) > 7 else "", dim_B=batch_dim(op))


PHASE_STAGES = 2   # cp.async stages per warp in an attention phase (the rest: the next ring)
PHASE_THREADS = 256   # an attention phase runs on a streamed kernel's consumer warps


def phase_geometry(op: Op, max_batch: int) -> dict:
    """:func:`geometry` of an attention phase (:data:`PHASE_STAGES`, 256 threads)."""
    return geometry(op, PHASE_THREADS, max_batch, PHASE_STAGES)


def phase_code(kernel: Graph, op: Op, refs: dict, smem: str, ws: str, counters: str,
               signal: str, wait: str = "", err: str = "", stamps=None) -> tuple[str, str]:
    """(file-level definitions, the consumers' code) of the attention phase ``op`` of streamed
    kernel ``kernel``: the units on the 256 consumer threads (named barrier 1, so the producer
    warp streams on), in shared memory at ``smem``, slots at ``ws`` and arrival counters at
    ``counters`` (C expressions); then each CTA signals counter word ``signal`` once. With
    ``wait`` (a counter word), first a wait for the op's ``wait_target`` signals (the QKV
    phase's flushes; bounded, setting error word ``err``). ``stamps``: a timeline build's
    (:class:`fusionc.codegen.stream_timeline.Stamps`)."""
    from fusionc.codegen.streamed import COUNTER_TIMEOUT_NS
    from fusionc.ir.ops.tile_attn_units import unsupported
    mb = kernel.attr("max_batch")
    geo = phase_geometry(op, mb)
    bad = unsupported(op.operands[0].type.dtype, geo["H"], geo["KVH"], geo["D"])
    if bad:
        raise CompileError("attention units cannot take " + ", ".join(bad), op=op.name,
                           loc=op.loc, valid="f16 or bf16, head_dim a multiple of 16")
    names = [refs[v.name] for v in op.operands]
    tv = template_vars(op, geo, PHASE_THREADS, mb, names)
    tv["qregs"] = False   # 288 threads: 168 registers a thread (3 warps on an SM quarter)
    defs = render("attn_defs.cu.j2", sync=f"fc_consumer_sync<{PHASE_THREADS}>()", **tv)
    body = render("attn_body.cu.j2", smem=smem, ws=ws, counters=counters, **tv)
    stamp = stamps.at if stamps is not None else (lambda label, role: "")
    if wait:   # every QKV group stored (acquire): then the units read qkv with plain loads
        body = (f"if (threadIdx.x == 0) fc_counter_wait<false>({wait}, "
                f"{op.attr('wait_target')}u, {err}, {COUNTER_TIMEOUT_NS}ull);\n"
                f"fc_consumer_sync<{PHASE_THREADS}>();\n" +
                stamp("consumers: the QKV flushes acquired", "consumer") + body)
    return defs, (body + f"\nfc_consumer_sync<{PHASE_THREADS}>();   // every store of o is done\n"
                  + stamp("consumers: attention units done", "consumer") +
                  f"if (threadIdx.x == 0) fc_counter_signal({signal});   // this CTA's units\n")


def freq_literals(op: Op) -> str:
    """RoPE's inverse frequencies of a units op (:func:`fusionc.ir.ops.rope.inv_freq`), rounded
    to fp32, as a C initializer list."""
    freq = inv_freq(op.attr("theta"), op.attr("rotary_dim"), op.attr("scaling"))
    return ", ".join(cnames.f32_literal(float(f)) for f in freq.astype(np.float32))


def unit_params(kernel: Graph, op: Op) -> tuple:
    """(the kernel's parameters, the C names of ``op``'s operands, RoPE's inverse frequencies
    as a C initializer list, the kernel's C name) of a units kernel (``attn_units``,
    ``mla_units``)."""
    from fusionc.codegen.streamed import tail_params, tensor_params
    params = tensor_params(kernel) + tail_params(kernel)
    ref = {kp.value.name: kp.name for kp in params if kp.kind == "tensor"}
    return (params, [ref[v.name] for v in op.operands], freq_literals(op),
            cnames.ident("fusionc", kernel.name))


def batch_dim(op: Op) -> str:
    """The batch rows at run time: the dim argument, or a static batch."""
    b = op.operands[1].type.shape[0]
    return cnames.dim_name(b) if isinstance(b, str) else str(b)
