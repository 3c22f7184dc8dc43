"""Design v2 passes: the unit schedule, the stream plan, barrier insertion and the shared-memory
plan of streamed persistent kernels (``lowering = v2``). Each shows in ``fusionc ir --after
NAME``:

``partition-units{max_batch, grid, chain = true, siblings = true, rows = 64, attention_o = false, attention_qkv = true}``
    Every ``linear`` of a graph becomes a streamed kernel (:mod:`fusionc.lower.linear_v2`):
    ``acc_alloc``, then ``units {count, group}`` with ``acc_gemv`` on the global tiles and
    ``group_flush``; the graph launches it. With ``chain``, linears that feed each other
    (:func:`fusionc.lower.match_v2.chains`) share one kernel, a ``units`` region (phase) each:
    each flush of a phase signals its K chunk of the next (``group_flush {signal, per}``), whose
    producer waits on it (``counter_wait {slot = step, reset = exit}``). With ``siblings``,
    linears that read the same x through the same RMSNorm prologue (an MLA block's w_q and
    w_kv_a: :func:`fusionc.lower.match_v2.sibling`) share one kernel as phases without waits,
    the kernel's ``row_rms`` serving both. An attention block's
    core (split, views, QK-norm, RoPE, KV append, decode attention:
    :func:`fusionc.lower.attention_v2.attention_cores`) becomes one ``attn_units`` kernel
    between the QKV and output projections. Launches of kernels lowered before (tile-IR
    kernels of the input) stay as they are. Multi-GPU collectives (``all_reduce``,
    ``all_reduce_add``, ``all_reduce_add_rms_norm``: tensor-parallel layers, after
    ``fuse-allreduce-norm``) stay in the graph between the kernels. Other ops are refused by
    name. A batch bucket past the fused kernels' is refused
    by name; ``fusionc.compile``'s default takes the library path there. ``rows``: weight rows
    per tile, 64 or 128 (tensor cores: one warpgroup per 64 rows over whole chunks, so each
    activation box serves twice the weight rows). With ``attention_o``, an attention core and
    its output projection share one kernel (:func:`fusionc.lower.attention_o.fused_attention`): the ``attn_units`` op
    first (the consumer warps), then the projection's units, whose producer streams its first
    weight stages while the attention runs and waits on one signal per CTA
    (``counter_wait {scale = grid}``) before it copies ``o_flat``.
``stream-plan{stages}``
    Where TMA can copy the rows (row bytes a multiple of 16), the tiles come through a ring:
    ``ring_alloc``, ``ring_issue`` (the producer's copies), ``ring_stage`` views read by
    ``acc_gemv``, ``ring_release``. Without waits: the next pass proves where they go.
``insert-barriers``
    Adds the ring protocol's waits: ``ring_claim`` before each ``ring_issue`` (the stage's
    previous fill released), ``ring_wait`` before the first read of a stage view, and
    ``fence_proxy_async`` between a producer's ``counter_wait`` and a later ``ring_issue``
    (TMA reads of data others wrote with ordinary stores). The simulator reports each missing
    one by name (``tests/sim/test_stream_hazards.py``).
``smem-plan{max_stages}``
    Sizes each ring: the most stages (at most ``max_stages``, default 4) whose bytes, with the
    kernel's other shared memory, fit in 227 KB per CTA (one CTA per SM). Deeper rings measured
    slower (BENCHMARKS.md, issue 20).
"""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.errors import LoweringError, PassError
from fusionc.ir.kernel import SMEM_LIMIT
from fusionc.ir.ops.comm import host_collective
from fusionc.ir.nodes import Graph, Module, Op, SymbolRef, Value
from fusionc.ir.registry import lookup
from fusionc.ir.types import TensorType
from fusionc.lower.attention_o import fits_two_stages, fused_attention, launch_values
from fusionc.lower.linear_v2 import ROWS, WIDE_ROWS
from fusionc.passes.attention_units import core_kernel, kernel_name, unit_cores
from fusionc.passes.base import Pass, register_pass
from fusionc.stream.ring import pad_rows, tma_rows

PRODUCER_THREADS = 288   # 8 consumer warps + the producer warp (fusionc.codegen.streamed)
V2_PIPELINE = ("fold-views,fuse-allreduce-norm,partition-units{{max_batch={mb}}},stream-plan,"
               "insert-barriers,smem-plan")


CHAIN_ABOVE_ROWS = 8   # chained linears share a kernel above this batch bucket (see below)
# The attention block in one kernel (partition-units{attention_o}) is off by default until it
# has run on a GPU (BENCHMARKS.md, fifteenth session: correct in the simulator, built without
# spills; not yet measured).
FUSE_ATTENTION = False


def v2_pipeline(max_batch: int, chain: bool | None = None, rows: int = ROWS) -> str:
    """The pipeline of ``lowering = v2``. ``chain``: chained linears (the MLP's gate/up and
    down) as the phases of one kernel (True) or one kernel each under programmatic dependent
    launch (False); default: chained above ``CHAIN_ABOVE_ROWS`` rows. Measured on an H200
    (2026-12-02, `benchmarks/mlp_block.py --compare-unchained`, same runs): one kernel is 8-10
    us faster at 16 rows (Llama-3-8B 104-106 vs 114-116 us) and 3-9 us slower at 1 and 4 rows
    (100-107 vs 96-98 us; BENCHMARKS.md, issue 21). ``rows``: weight rows per tile
    (``partition-units{rows}``: 64, or 128 on tensor cores; 128 measured faster at 1-32 rows,
    slower from 64: ``fusionc.cost.h200.Device.v2_path``)."""
    out = V2_PIPELINE.format(mb=max_batch)
    if chain is None:
        chain = max_batch > CHAIN_ABOVE_ROWS
    out = out if chain else out.replace("}", ", chain=false}", 1)
    return out if rows == ROWS else out.replace("}", f", rows={rows}}}", 1)


def _op(name: str, operands=(), results=(), loc=None, regions=(), **attrs) -> Op:
    return Op(name, tuple(results), tuple(operands), lookup(name).make_attrs(attrs, loc),
              tuple(regions), loc)


def _kernels(module: Module, fn) -> Module:
    return Module(tuple(fn(g) if g.kind == "kernel" and _units(g) else g for g in module.graphs))


def _units(k: Graph) -> Op | None:
    from fusionc.ir.ops.tile_units import units_op
    return units_op(k)


def _phases(k: Graph) -> list[Op]:
    from fusionc.ir.ops.tile_units import phases_of
    return phases_of(k)


@register_pass
@dataclass(frozen=True)
class PartitionUnits(Pass):
    """See the module docstring."""

    name = "partition-units"
    max_batch: int = 8
    grid: int = 0
    chain: bool = True     # chained linears as phases of one kernel (match_v2.chains)
    siblings: bool = True  # linears reading the same x as phases of one kernel (no waits)
    rows: int = ROWS       # weight rows per tile (or WIDE_ROWS: tensor cores)
    attention_o: bool = FUSE_ATTENTION   # an attention core and its O projection: one kernel
    attention_qkv: bool = True   # ... and its QKV projection (with attention_o)

    def check_options(self) -> None:
        """PassError for a batch bucket < 1, a negative grid (0: one CTA per SM) or tiles of
        other than 64 or 128 rows."""
        if self.max_batch < 1 or self.grid < 0:
            raise PassError(f"max_batch = {self.max_batch}, grid = {self.grid}", op=self.name,
                            valid="max_batch >= 1 and grid >= 0 (0: one CTA per SM)")
        if self.rows not in (ROWS, WIDE_ROWS):
            raise PassError(f"rows = {self.rows}", op=self.name, valid=f"{ROWS} or {WIDE_ROWS}")

    def run(self, module: Module) -> Module:
        items = [g for g in module.graphs if g.kind == "kernel"]
        hosts = []
        for g in module.graphs:
            if g.kind == "graph":
                kernels, host = self.partition(g, module)
                items += kernels
                hosts.append(host)
        return Module(tuple(items + hosts))

    def _probe(self, core, specs: list) -> int:
        """The weight rows per tile (``rows``, else 64) with which ``core`` and its projections
        ``specs`` fit one kernel (a ring of two stages), or 0."""
        from fusionc.lower.linear_v2 import lower_chain
        for rows in dict.fromkeys((self.rows, ROWS)):
            if fits_two_stages(lower_chain(specs, "probe", self.max_batch, self.grid or None,
                                           rows, attention=core)):
                return rows
        return 0

    def partition(self, g: Graph, module: Module) -> tuple[list[Graph], Graph]:
        """The kernels of graph ``g`` (:func:`fusionc.lower.match_v2.linear_kernels`) and ``g``
        launching them; LoweringError for an op no kernel takes."""
        from fusionc.lower.linear_v2 import lower_chain
        from fusionc.lower.match_v2 import chains, linear_kernels
        found = linear_kernels(g)
        specs = {id(k.linear): k for k in found}
        cut = chains(g, found, self.chain, self.siblings)
        chain_of = {id(k.linear): c for c in cut for k in c}
        from fusionc.lower.mla_v2 import host_ops
        cores = unit_cores(g)
        between = {id(o) for o in host_ops(g)} if any(
            op.name == "mla_decode_attention" for op in g.body) else set()
        folded = {id(o) for k in specs.values() for o in k.absorbed}
        folded |= {id(k.norm) for k in specs.values() if k.norm is not None}
        folded |= {id(o) for c in cores.values() for o in c.absorbed}
        fused = fused_attention(g, cores, specs, chain_of, self._probe, self.attention_qkv) \
            if self.attention_o else {}
        in_block = {id(s.linear) for f in fused.values() for s in f.specs}
        in_block |= {id(f.attention) for f in fused.values()}
        made = {p.name for p in g.params}
        kernels, body = [], []
        for i, op in enumerate(g.body):
            if op.name == "launch":
                if _units(module[op.attr("kernel").name]) is not None:
                    raise PassError("the graph is already lowered (it launches streamed "
                                    "kernels)",
                                    op=self.name, loc=op.loc,
                                    valid="partition-units once, on graph IR")
                made.update(r.name for r in op.results)   # a tile-IR kernel of the input
                body.append(op)
                continue
            if id(op) in in_block and id(op) not in fused:
                continue   # launched with its output projection
            if id(op) in cores:
                k, launch = core_kernel(cores[id(op)], kernel_name(g, i, module), made,
                                        self.max_batch)
                kernels.append(k)
                body.append(launch)
                continue
            if id(op) in folded:
                continue
            if host_collective(op) or id(op) in between:   # between the kernels, on the host
                _made_before(op, made)
                made.update(r.name for r in op.results)
                body.append(op)
                continue
            if op.name == "reshape":
                raise LoweringError("a view that fold-views does not cancel", op=op.name,
                                    loc=op.loc, valid="views between a linear and the next, "
                                    "past elementwise ops (run fold-views first: v2_pipeline "
                                    "does); graph inputs and outputs in their flat form")
            if op.name == "head_linear" and id(op) not in specs:
                raise LoweringError("a head_linear no block-diagonal kernel takes", op=op.name,
                                    loc=op.loc, valid="a static graph-input weight [H, N, K] "
                                    "with N a multiple of 64 and K of whole 256-byte tiles, "
                                    "x a [B, H, K] kernel output or graph input (or the first "
                                    "part of split(reshape(q)) in an MLA block); elsewhere in "
                                    "an MLA block it runs on the host; others on "
                                    "the library path")
            if op.name != "linear" and id(op) not in specs:
                raise LoweringError("not lowered by lowering v2 yet", op=op.name, loc=op.loc,
                                    valid="linear layers with an rms_norm before them and "
                                          "bias, silu, silu_mul (of a split), add, mul or cast "
                                          "after them, and attention blocks in the form "
                                          "of fusionc.models.blocks; others on the mixed "
                                          "or library path")
            if op.operands[1].name not in {p.name for p in g.params}:
                raise LoweringError(f"the weight %{op.operands[1].name} is computed in "
                                    "the graph", op=op.name, loc=op.loc,
                                    valid="weights that are graph inputs on lowering v2 "
                                          "(their first tiles stream before the previous "
                                          "kernel finished)")
            chain = chain_of[id(op)]
            if chain[0] is not specs[id(op)]:
                continue   # a later phase of the kernel launched at the chain's first linear
            block = fused.get(id(op))
            core = cores[id(block.attention)] if block else None
            k = lower_chain(list(block.specs) if block else chain, kernel_name(g, i, module),
                            self.max_batch, self.grid or None,
                            block.rows if block else self.rows, attention=core)
            outs, ins = launch_values(k, core)
            for v in ins:
                if v.name not in made:
                    raise LoweringError(f"%{v.name} is folded into another kernel, but "
                                        "read here", op=op.name, loc=op.loc,
                                        valid="values used by one kernel only, or graph inputs")
            made.update(v.name for v in outs)
            kernels.append(k)
            body.append(_op("launch", ins, outs, op.loc, kernel=SymbolRef(k.name)))
        return kernels, g.replace(body=tuple(body))


def _made_before(op: Op, made: set) -> None:
    """LoweringError unless every operand of host op ``op`` exists when it runs (a graph input
    or a kernel's output, not a value folded into a kernel)."""
    for v in op.operands:
        if v.name not in made:
            raise LoweringError(f"%{v.name} is folded into a kernel, but read here", op=op.name,
                                loc=op.loc, valid="values used by one kernel only, or graph "
                                                  "inputs")


@register_pass
@dataclass(frozen=True)
class StreamPlan(Pass):
    """See the module docstring."""

    name = "stream-plan"
    requires = ("partition-units", "attention-units")
    stages: int = 2

    def check_options(self) -> None:
        """PassError for a ring of other than 2 to 16 stages (smem-plan deepens it later)."""
        if not 2 <= self.stages <= 16:
            raise PassError(f"stages = {self.stages}", op=self.name, valid="2 to 16")

    def run(self, module: Module) -> Module:
        return _kernels(module, self.plan)

    def plan(self, k: Graph) -> Graph:
        phases = _phases(k)
        if any(op.name == "ring_issue" for u in phases for op in u.regions[0]):
            return k
        gemvs = [next(op for op in u.regions[0] if op.name == "acc_gemv") for u in phases]
        if not all(tma_rows(g.operands[2].type.shape[-1], g.operands[2].type.dtype.itemsize)
                   for g in gemvs):   # the plain-load path (lowering chains ring kernels only)
            return k
        g0 = gemvs[0]
        dt, rows, cols = g0.operands[2].type.dtype, g0.attr("rows"), g0.attr("cols")
        mb = k.attr("max_batch")
        xrows = mb if dt.itemsize == 4 else pad_rows(mb)   # whole mma n-tiles
        ring = Value(f"ring_{g0.loc.line if g0.loc else 0}",
                     TensorType(dt, (self.stages, rows + xrows, cols)))
        top = list(k.body)
        for p, (units, gemv) in enumerate(zip(phases, gemvs)):
            body = list(units.regions[0])
            acc, x, w = gemv.operands[:3]
            sfx = f".{p}" if len(phases) > 1 else ""
            tw = Value(f"{ring.name}.w{sfx}", TensorType(dt, (rows, cols)))
            tx = Value(f"{ring.name}.x{sfx}", TensorType(dt, (xrows, cols)))
            i = body.index(gemv)
            body[i:i + 1] = [
                _op("ring_issue", (ring, w, x), loc=gemv.loc, split=gemv.attr("split"),
                    head_rows=gemv.attr("head_rows"), head_cols=gemv.attr("head_cols")),
                _op("ring_stage", (ring,), (tw, tx), gemv.loc, rows=rows),
                gemv.replace(operands=(acc, tx, tw) + gemv.operands[3:]),
                _op("ring_release", (ring,), loc=gemv.loc)]
            top[top.index(units)] = units.replace(regions=(tuple(body),))
        top.insert(top.index(next(o for o in top if lookup(o.name).has("units"))),
                   _op("ring_alloc", (), (ring,), g0.loc, rows=rows))
        attrs = tuple((a, PRODUCER_THREADS if a == "threads" else v) for a, v in k.attrs)
        return k.replace(body=tuple(top), attrs=attrs)


@register_pass
@dataclass(frozen=True)
class InsertBarriers(Pass):
    """See the module docstring."""

    name = "insert-barriers"
    requires = ("stream-plan",)

    def run(self, module: Module) -> Module:
        return _kernels(module, self.insert)

    def insert(self, k: Graph) -> Graph:
        for units in _phases(k):
            k = self._insert(k, units)
        return k

    def _insert(self, k: Graph, units: Op) -> Graph:
        out: list[Op] = []
        views: dict[str, Value] = {}     # stage view -> its ring
        waited: set[str] = set()
        acquired = False                  # a producer counter_wait not yet fenced
        for op in units.regions[0]:
            if op.name == "ring_issue":
                ring = op.operands[0]
                if acquired:
                    out.append(_op("fence_proxy_async", loc=op.loc, warp="producer"))
                    acquired = False
                if not out or out[-1].name != "ring_claim":
                    out.append(_op("ring_claim", (ring,), loc=op.loc))
            if op.name == "counter_wait" and op.attr("warp") == "producer":
                acquired = True
            if op.name == "fence_proxy_async":
                acquired = False
            for v in op.operands:
                if v.name in views and views[v.name].name not in waited:
                    out.append(_op("ring_wait", (views[v.name],), loc=op.loc))
                    waited.add(views[v.name].name)
            if op.name == "ring_wait":
                waited.add(op.operands[0].name)
            out.append(op)
            if op.name == "ring_stage":
                views.update({r.name: op.operands[0] for r in op.results})
        top = [units.replace(regions=(tuple(out),)) if o is units else o for o in k.body]
        return k.replace(body=tuple(top))


@register_pass
@dataclass(frozen=True)
class SmemPlan(Pass):
    """See the module docstring."""

    name = "smem-plan"
    requires = ("stream-plan",)
    max_stages: int = 4   # 4 beat 6 and 8 on an H200 (2026-12-02: 13.7 vs 16.0 us, 4096 x 4096)

    def check_options(self) -> None:
        """PassError for a ring of fewer than 2 or more than 16 stages."""
        if not 2 <= self.max_stages <= 16:
            raise PassError(f"max_stages = {self.max_stages}", op=self.name,
                            valid="2 to 16 stages")

    def run(self, module: Module) -> Module:
        self.check_options()   # also for instances not made from a pipeline string
        return _kernels(module, self.size)

    def size(self, k: Graph) -> Graph:
        from fusionc.codegen.streamed import plan
        ring = next((op for op in k.body if op.name == "ring_alloc"), None)
        if ring is None:
            return k
        best = k
        for s in range(2, self.max_stages + 1):
            cand = _with_stages(k, ring, s)
            if plan(cand, check=False).smem + 1024 > SMEM_LIMIT:
                break
            best = cand
        return best


def _with_stages(k: Graph, ring: Op, stages: int) -> Graph:
    old = ring.result
    new = Value(old.name, old.type.with_shape((stages,) + old.type.shape[1:]))

    def fix(op: Op) -> Op:
        return op.replace(
            results=tuple(new if r.name == old.name else r for r in op.results),
            operands=tuple(new if v.name == old.name else v for v in op.operands),
            regions=tuple(tuple(fix(o) for o in r) for r in op.regions))
    return k.replace(body=tuple(fix(op) for op in k.body))
