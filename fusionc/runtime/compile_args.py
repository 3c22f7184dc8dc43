"""The arguments of ``fusionc.compile`` (:mod:`fusionc.runtime.compiled`): their checks (each
bad one an InputError naming it and what is valid), the tuned choices stored for a graph, and
the check that a lowered host graph holds only what the runtime runs."""
from __future__ import annotations

from fusionc.errors import CompileError, InputError
from fusionc.ir.nodes import Graph, Module


def check_options(program, max_batch, kv_len) -> None:
    if not isinstance(program, (Module, Graph)):
        raise InputError(f"cannot compile a {type(program).__name__}",
                         valid="a fusionc.ir.Module or Graph (a @fusionc.graph function, or "
                               "fusionc.dsl.loader.load_file(path))")
    for name, v in (("max_batch", max_batch), ("kv_len", kv_len)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InputError(f"{name} = {v!r}", valid=f"a positive integer {name}")


def check_kinds(codegen, progress, pipeline, pdl, autotune):
    """InputError for arguments of :func:`compile` of the wrong type; returns ``codegen`` as
    CodegenOptions (or None), parsing its string form."""
    from fusionc.codegen import CodegenOptions
    from fusionc.codegen.context import parse_codegen_options
    if isinstance(codegen, str):
        codegen = parse_codegen_options(codegen)
    if codegen is not None and not isinstance(codegen, CodegenOptions):
        raise InputError(f"codegen = {codegen!r}", valid="None, a fusionc.codegen."
                         "CodegenOptions, or a string such as 'gemv_unroll=8'")
    if progress is not None and not callable(progress):
        raise InputError(f"progress = {progress!r}", valid="None or a callable(str), e.g. print")
    if pipeline is not None and not isinstance(pipeline, str):
        raise InputError(f"pipeline = {pipeline!r}", valid='None or a pipeline string such as '
                         '"fold-views,partition-units{max_batch=4}"')
    for name, v in (("pdl", pdl), ("autotune", autotune)):
        if not isinstance(v, bool):
            raise InputError(f"{name} = {v!r}", valid="True or False")
    return codegen


def check_split_options(split_tokens, min_split_tokens, side_ctas) -> None:
    """InputError unless the token-split options of :func:`compile` are in range."""
    from fusionc.ir.ops.tokens import MAX_PARTS
    for name, v, lo, hi in (("split_tokens", split_tokens, 1, MAX_PARTS),
                            ("min_split_tokens", min_split_tokens, 0, None),
                            ("side_ctas", side_ctas, 1, 256)):
        if v is None and name == "split_tokens":
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi and v > hi):
            raise InputError(f"{name} = {v!r}", valid=f"an integer from {lo}" +
                             (f" to {hi}" if hi else ""))


def check_lowering(lowering, pipeline, cluster=None, scheme=None) -> None:
    """InputError unless ``lowering`` is None, ``"auto"`` or ``"v2"`` (v1's cluster kernels
    were removed), for v1's options ``cluster`` and ``scheme`` given, or for an empty
    ``pipeline`` string."""
    for name, v in (("cluster", cluster), ("scheme", scheme)):
        if v is not None:
            raise InputError(f"{name} = {v!r}", valid=f"no {name}: an option of lowering v1's "
                             "cluster kernels, removed with it (design v2 sizes its grids "
                             "by the occupancy query)")
    if not isinstance(lowering, (str, type(None))) or lowering not in (None, "auto", "v2"):
        raise InputError(f"lowering = {lowering!r}",
                         valid="None, 'auto' or 'v2' (design v2 lowers every graph; "
                               "lowering v1's cluster kernels were removed)")
    if isinstance(pipeline, str) and not pipeline.strip():
        raise InputError("pipeline = ''", valid="a pipeline of passes, e.g. "
                         "fusionc.passes.stream.v2_pipeline(8), or None for the default")


def tuned_v2(g: Graph, max_batch: int, kv_len: int, search: bool, split_tokens) -> str | None:
    """The pipeline of the v2 choice stored for this graph and GPU (searched first when
    ``search`` and nothing is stored); None to let the cost table decide (also with
    ``split_tokens``, a library-path option)."""
    from fusionc.tune import autotune, lookup
    from fusionc.tune.search import V2Choice
    if split_tokens is not None:
        return None
    hit = lookup(g, max_batch, kv_len)
    if hit is None and search:
        best, _ = autotune(g, max_batch, kv_len)
        hit = {"path": best.path, "chain": best.chain, "fuse": best.fuse}
    if hit is None:
        return None
    return V2Choice(hit["path"], hit["chain"], hit.get("fuse", False)).compile_kwargs(
        g, max_batch)["pipeline"]


def check_launches_only(host: Graph) -> None:
    """CompileError unless every op of the lowered host graph is a kernel launch, a
    tensor-parallel collective or a host op (:data:`fusionc.runtime.host_ops.HOST_OPS`) of a
    float dtype, with RMSNorm over rows ``[T, D]``."""
    from fusionc.ir.types import DType
    from fusionc.runtime.host_ops import HOST_COMPUTE, HOST_OPS, HOST_VIEWS
    for op in host.body:
        if op.name != "launch" and op.name not in HOST_OPS:
            raise CompileError("op is neither part of a fused kernel nor run by a library",
                               op=op.name, loc=op.loc,
                               valid="attention and MLP blocks (fused kernels); linear (with "
                                     "a bias or not), RMSNorm, SiLU, SiLU·mul, add, mul, cast, "
                                     "embedding, feature splits and collectives (library "
                                     "path, many tokens)")
        if op.name in HOST_OPS and op.results and (
                op.name not in HOST_VIEWS and
                op.results[0].type.dtype.value not in ("f16", "bf16", "f32") or
                op.name in HOST_COMPUTE and any(v.type.dtype.value not in ("f16", "bf16", "f32")
                                                for v in op.operands) or
                op.name == "library_call" and op.operands[0].type.rank != 2 or
                op.name == "rms_norm" and op.operands[0].type.rank < 2 or
                op.name == "library_call" and op.results[0].type.dtype not in
                (op.operands[0].type.dtype, DType.f32)):
            raise CompileError(f"'{op.name}' on {op.operands[0].type}", op=op.name,
                               loc=op.loc, valid="f16, bf16 or f32 rows [T, D] (RMSNorm: "
                                                 "[T, ..., D]); a GEMM's out_dtype that of x "
                                                 "or f32 (cuBLAS)")
    if not host.body:
        raise CompileError("the graph has no attention or MLP block to compile", op=host.name,
                           loc=host.loc, valid="a graph with decode_attention or silu_mul")


def pick_graph(module: Module, graph: str | None) -> str:
    graphs = [g.name for g in module.graphs if g.kind == "graph"]
    if graph is None and len(graphs) == 1:
        return graphs[0]
    if graph in graphs:
        return graph
    raise InputError(f"which graph? {'no graph ' + repr(graph) if graph else 'several'}",
                     valid="graph= one of " + ", ".join(graphs))
