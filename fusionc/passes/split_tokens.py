"""Pass ``split-tokens{parts=2}``: token-split compute/communication overlap (TokenWeave: Gond,
Kwatra, Ramjee 2025, arXiv 2505.11329, §4).

A tensor-parallel graph whose ops all work row by row on the tokens ``[B, ...]`` (linear and
library calls with or without a bias, RMSNorm, SiLU, SiLU·mul, adds, muls, casts, splits along
features, the collectives) is cut into
``parts`` row blocks by ``token_split`` (sizes: :func:`fusionc.ir.ops.tokens.split_sizes`,
wave-aware, no split below ``min_tokens``). The ops are repeated per block, block after block;
the collectives of every block but the last run on stream 1 (``stream = 1``), so block i's
all-reduce overlaps block i+1's GEMMs on stream 0; the last block's collective stays on stream
0 (nothing is left to overlap it with), and ``token_concat`` joins the blocks. The runtime
orders the streams by the data dependencies. Same results as the unsplit graph: rows are
independent.

Options: ``parts``; ``min_tokens`` (measured threshold, BENCHMARKS.md); ``tile``, ``tile_n``
(the GEMM tile, rows × columns) and ``sms`` for the wave rule.
"""
from __future__ import annotations

from dataclasses import dataclass

from fusionc.errors import PassError
from fusionc.ir.nodes import Graph, Module, Op, Value
from fusionc.ir.ops.tokens import HOST_ROWWISE, MAX_PARTS, part_symbol
from fusionc.ir.registry import lookup
from fusionc.passes.base import Pass, register_pass

# what the runtime can run outside fusionc kernels, row by row (an embedding's rows: its
# token ids, the table whole)
ROWWISE = HOST_ROWWISE | {"linear", "embedding"}
COMM = frozenset({"all_reduce", "all_reduce_add", "all_reduce_add_rms_norm"})


@register_pass
@dataclass(frozen=True)
class SplitTokens(Pass):
    """See the module docstring."""

    name = "split-tokens"
    parts: int = 2
    min_tokens: int = 1024
    tile: int = 128
    tile_n: int = 256
    sms: int = 132

    def run(self, module: Module) -> Module:
        if not 1 <= self.parts <= MAX_PARTS or self.tile < 1 or self.tile_n < 1 or \
                self.sms < 1 or self.min_tokens < 0:
            raise PassError(f"{self.spec()}", op=self.name,
                            valid=f"1 <= parts <= {MAX_PARTS}; tile, tile_n, sms >= 1; "
                                  "min_tokens >= 0")
        return Module(tuple(self.rewrite(g) if g.kind == "graph" else g
                            for g in module.graphs))

    def rewrite(self, g: Graph) -> Graph:
        """``g`` split into blocks (unchanged for parts = 1 or without a token dim)."""
        sym = next((p.type.shape[0] for p in g.params
                    if p.type.rank and isinstance(p.type.shape[0], str)), None)
        if sym is None or self.parts == 1:
            return g
        if any(op.name in ("token_split", "token_concat") for op in g.body):
            raise PassError("the graph is already split into token blocks", op=self.name,
                            loc=g.loc, valid="split-tokens once per pipeline")
        for op in g.body:
            _check_rowwise(op, sym)
        for v in g.outputs:
            if not _rows(v, sym):
                raise PassError(f"output %{v.name} has type {v.type}", op=self.name,
                                loc=g.loc, valid=f"outputs [{sym}, ...] (row blocks)")
        attrs = lookup("token_split").make_attrs(
            {"parts": self.parts, "min_tokens": self.min_tokens, "tile": self.tile,
             "n_tiles": _n_tiles(g, self.tile_n), "sms": self.sms})
        taken = {p.name for p in g.params} | {r.name for op in g.body for r in op.results}
        fresh = _Fresh(taken)
        body, blocks = [], {}
        for p in g.params:
            if _rows(p, sym):
                res = tuple(Value(fresh(f"{p.name}.{i}"), _block_type(p.type, sym, i))
                            for i in range(self.parts))
                body.append(Op("token_split", res, (p,), attrs, loc=g.loc))
                blocks[p.name] = res
        for i in range(self.parts):
            for op in g.body:
                body.append(self._block_op(op, i, sym, blocks, fresh))
        joined = {}
        for v in g.outputs:   # one joined value per output (a param or a repeated output too)
            if v.name not in joined:
                name = v.name if v.name not in {p.name for p in g.params} else fresh(v.name)
                joined[v.name] = Value(name, v.type)
                body.append(Op("token_concat", (joined[v.name],), tuple(blocks[v.name]), (),
                               loc=g.loc))
        return g.replace(body=tuple(body), outputs=tuple(joined[v.name] for v in g.outputs))

    def _block_op(self, op: Op, i: int, sym: str, blocks: dict, fresh) -> Op:
        operands = tuple(blocks[v.name][i] if v.name in blocks else v for v in op.operands)
        results = tuple(Value(fresh(f"{r.name}.{i}"), _block_type(r.type, sym, i))
                        for r in op.results)
        for r, b in zip(op.results, results):
            blocks.setdefault(r.name, [None] * self.parts)[i] = b
        attrs = op.attrs
        if op.name in COMM:   # every block's collective but the last on the side stream
            attrs = tuple((k, (1 if i < self.parts - 1 else 0) if k == "stream" else v)
                          for k, v in attrs)
        return Op(op.name, results, operands, attrs, loc=op.loc)


class _Fresh:
    """Names not yet used in the graph: ``name``, else ``name_1``, ``name_2``, …"""

    def __init__(self, taken: set):
        self.taken = taken

    def __call__(self, name: str) -> str:
        out, k = name, 0
        while out in self.taken:
            k += 1
            out = f"{name}_{k}"
        self.taken.add(out)
        return out


def _rows(v: Value, sym: str) -> bool:
    return v.type.rank >= 1 and v.type.shape[0] == sym


def _block_type(t, sym: str, i: int):
    return t.with_shape((part_symbol(sym, i),) + t.shape[1:]) if t.rank and t.shape[0] == sym \
        else t


def _check_rowwise(op: Op, sym: str) -> None:
    rows = [v for v in op.operands + op.results if sym in v.type.shape]
    bad = op.name not in ROWWISE or any(v.type.shape[0] != sym or sym in v.type.shape[1:]
                                        for v in rows)
    if op.name == "split" and op.attr("axis") % op.operands[0].type.rank == 0:
        bad = True
    if bad:
        raise PassError(f"'{op.name}' does not work row by row on the tokens {sym}",
                        op="split-tokens", loc=op.loc,
                        valid="linear (with or without a bias), RMSNorm, SiLU, SiLU·mul, adds, "
                              "muls, casts, embeddings, feature splits and collectives "
                              "(prefill-style "
                              "graphs; attention is not split)")


def _n_tiles(g: Graph, tile_n: int) -> int:
    """GEMM tile columns of the widest linear layer of ``g`` (1 without one)."""
    widths = [op.operands[1].type.shape[0] for op in g.body
              if op.name in ("linear", "library_call")]
    return max([-(-n // tile_n) for n in widths if isinstance(n, int)] or [1])
