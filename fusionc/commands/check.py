"""The simulator check of ``fusionc compile``: the lowered module run by the tile-IR simulator
on random inputs against the graph-IR interpreter, planned to fit in memory."""
from __future__ import annotations

CHECK_COPIES = 3   # random inputs, the interpreter's and the simulator's rounded copies


def check_batch(g, max_batch: int) -> int:
    """Rows for the simulator check: the graph's static batch (the length of its integer
    vectors, positions and seq_lens, else the first input's leading dim), else 2 (at most
    max_batch)."""
    ints = [p.type.shape[0] for p in g.params if p.type.rank == 1 and not p.type.dtype.is_float]
    first = [p.type.shape[0] for p in g.params[:1] if p.type.rank]
    lead = (ints or first or ["B"])[0]
    return lead if isinstance(lead, int) else max(1, min(2, max_batch))


def check_memory(g, batch: int) -> int:
    """Bytes the simulator check of ``g`` at ``batch`` rows needs, about: every parameter and
    op result as fp32, :data:`CHECK_COPIES` times."""
    env = {d: batch for p in g.params for d in p.type.shape if isinstance(d, str)}
    values = list(g.params) + [r for op in g.body for r in op.results]
    elems = 0
    for v in values:
        env.update({d: batch for d in v.type.shape if isinstance(d, str)})
        elems += v.type.numel(env)
    return 4 * CHECK_COPIES * elems


def memory_budget() -> int:
    """Bytes the simulator check may use: half the memory available now."""
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024 // 2
    except (OSError, KeyError, ValueError):
        import os
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


def check_plan(g, batch: int) -> tuple[int, str | None]:
    """(batch for the simulator check, None), with batch lowered to 1 when ``batch`` rows do
    not fit in :func:`memory_budget`; or (0, a line saying why the check is skipped)."""
    budget = memory_budget()
    for b in dict.fromkeys((batch, 1)):
        if check_memory(g, b) <= budget:
            return b, None
    need = check_memory(g, 1)
    return 0, (f"simulator check @{g.name} skipped: it needs about {need / 2**30:.1f} GiB, "
               f"more than half the memory available ({budget / 2**30:.1f} GiB); check "
               "smaller sizes (-D), or pass --no-check")


def simulator_check(g, lowered, batch: int = 2, seed: int = 0) -> str:
    """Run the lowered module in the simulator and the graph in the interpreter on the same
    random inputs; one line with the relative error of each output."""
    import numpy as np
    from fusionc.interp import interpret
    from fusionc.interp.numerics import defined_relative_error
    from fusionc.interp.numerics import round_to
    from fusionc.sim import simulate
    rng = np.random.default_rng(seed)
    # rounded to the parameter dtypes once: the interpreter and the simulator then only copy
    drawn = random_inputs(g, batch, rng)
    args = {p.name: round_to(drawn[p.name], p.type.dtype) for p in g.params}
    groups = [op.attr("group") for op in g.body if op.name.startswith("all_reduce")]
    if groups:   # tensor parallelism: every simulated rank gets the same inputs
        ranks = [args] * max(groups)
        ref, got = interpret(g, ranks)[0], simulate(lowered, ranks, graph=g.name)[0]
    else:
        ref, got = interpret(g, args), simulate(lowered, args, graph=g.name)
    errs = [defined_relative_error(a, r) for a, r in zip(got, ref)]
    ok = all(e <= CHECK_TOLERANCE for e in errs)
    return (f"simulator check @{g.name} (batch {batch}, relative error per output, tolerance "
            f"{CHECK_TOLERANCE:.0e}): "
            + ", ".join(f"{output_label(v, i)} {e:.1e}"
                        for i, (v, e) in enumerate(zip(g.outputs, errs)))
            + (" ok" if ok else " FAILED"))


CHECK_TOLERANCE = 1e-2   # norm-wise relative error, simulator vs interpreter, per output


def output_label(v, i: int) -> str:
    """How the check line names output ``i`` (value ``v``): its name, or ``output i`` for an
    unnamed result (``%0``: a returned expression such as ``x + linear(...)``)."""
    return f"output {i}" if v.name.isdigit() else v.name


def lowering_notes(name: str, lowered) -> list[str]:
    """Lines that say how graph ``name`` was lowered when it is not one fused kernel per block:
    library calls (cuBLAS GEMMs, row kernels) instead of fused fusionc kernels."""
    host = lowered[name]
    calls = [op for op in host.body if op.name == "library_call"]
    if not calls:
        return []
    kernels = sum(op.name == "launch" for op in host.body)
    fused = f"{kernels} fused kernel launch(es)" if kernels else "no fused kernel"
    attention = any(op.name == "decode_attention" for op in host.body)
    return [f"@{name}: {len(calls)} library call(s) (cuBLAS GEMMs for the linear layers, pass "
            "lower-library: many tokens, no block the fused kernels cover, "
            + ("an attention the units do not take (run on the host), " if attention else "")
            + "a batch past the fused kernels' bucket or where the cost table measured it "
            "faster), the other ops as "
            f"row kernels; {fused}"]


def random_inputs(g, batch: int, rng, max_len: int = 37) -> dict:
    """Fresh random inputs (float32): weights scaled by 1/sqrt(fan-in), KV rows of different
    lengths in 1..min(max_len, max_seq) (the first row the longest) with NaN past each length,
    positions = length - 1 (:func:`positions_params`), other integer vectors (seq_lens) =
    length. Caches are the rank-4 parameters
    ``[B, S, kv_heads, D]`` and rank-3 parameters named ``*cache*`` (MLA's ``[B, S, W]``)."""
    import numpy as np
    caches = [p for p in g.params   # KV caches [B, S, kv_heads, D], MLA latent caches [B, S, W]
              if p.type.rank == 4 or (p.type.rank == 3 and "cache" in p.name)]
    lens = None
    if caches:
        top = min(max_len, caches[0].type.shape[1])
        lens = rng.integers(1, top + 1, batch)
        lens[0] = top
    out = {}
    for p in g.params:
        shape = tuple(batch if isinstance(d, str) else d for d in p.type.shape)
        if p in caches:   # rows past the longest length are NaN only (costly to draw)
            a = np.full(shape, np.nan, np.float32)
            rows = min(int(lens.max()), shape[1])
            a[:, :rows] = rng.standard_normal((shape[0], rows, *shape[2:]), dtype=np.float32)
            a[np.arange(shape[1])[None, :] >= lens[:, None]] = np.nan
            out[p.name] = a
        elif p.type.dtype.is_float:
            a = rng.standard_normal(shape, dtype=np.float32)
            if len(shape) == 2 and shape[0] != batch:
                a /= np.sqrt(shape[1])
            out[p.name] = a
    pos = positions_params(g)
    for p in g.params:
        if not p.type.dtype.is_float:
            n = lens if lens is not None else np.ones(batch, int)
            out[p.name] = (n - (p.name in pos)).astype(p.type.dtype.numpy)
    return out


def positions_params(g) -> set[str]:
    """Names of the parameters of ``g`` that are positions: used as the ``positions`` operand
    of an op (kv_cache_append, rope, ...), or named ``pos*`` and not used as ``seq_lens``."""
    from fusionc.ir.registry import lookup
    slots: dict[str, set] = {}
    for op in (o for top in g.body for o in top.walk()):
        d = lookup(op.name)
        names = [s.rstrip("?*") for s in d.operands] if d is not None else []
        for i, v in enumerate(op.operands):
            if names:
                slots.setdefault(v.name, set()).add(names[min(i, len(names) - 1)])
    return {p.name for p in g.params
            if "positions" in slots.get(p.name, ())
            or (p.name.startswith("pos") and "seq_lens" not in slots.get(p.name, ()))}
