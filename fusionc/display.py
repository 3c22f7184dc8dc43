"""Rich display in Jupyter/IPython: IR, compiled graphs and kernels render as readable text
(``_repr_pretty_``) and as collapsible HTML blocks (``_repr_html_``)."""
from __future__ import annotations

import html


def html_block(title: str, body: str, open_: bool = True, note: str = "") -> str:
    """A ``<details>`` block titled ``title`` with ``body`` as preformatted text."""
    extra = f"<div style='margin:2px 0'>{html.escape(note)}</div>" if note else ""
    return (f"<details{' open' if open_ else ''}><summary><b>{html.escape(title)}</b></summary>"
            f"{extra}<pre style='font-size:12px;line-height:1.3'>{html.escape(body)}</pre>"
            "</details>")


def graph_text(g) -> str:
    """The IR text of a graph or kernel."""
    from fusionc.ir.printer import print_graph
    return print_graph(g)


def module_text(m) -> str:
    """The IR text of a module."""
    from fusionc.ir.printer import print_module
    return print_module(m)


def graph_html(g) -> str:
    """A graph or kernel as HTML: its kind, name and IR text."""
    return html_block(f"{g.kind} @{g.name}", graph_text(g))


def module_html(m) -> str:
    """Every graph and kernel of a module, each in its own block."""
    return "".join(graph_html(g) for g in m.graphs)


def kernel_html(k) -> str:
    """A compiled kernel: resource report, then its CUDA source (collapsed)."""
    return html_block(k.source.name, k.source.source, open_=False, note=k.report())


def compiled_html(c) -> str:
    """A compiled graph: the launch sequence, then each kernel."""
    head = html_block(f"compiled @{c.host.name} (batch <= {c.max_batch})", graph_text(c.host),
                      note=f"{len(c.kernels)} kernel(s)")
    return head + "".join(kernel_html(k) for k in c.kernels.values())


def signature(g) -> str:
    """``@name(param, ...)``: a graph's name and parameter names, for short reprs."""
    return f"@{g.name}({', '.join(p.name for p in g.params)})"


def compiled_repr(c) -> str:
    """The one-line repr of a compiled graph: name, parameters, batch bucket, kernels."""
    kernels = ", ".join(c.kernels) or "no fusionc kernel"
    return f"<CompiledGraph {signature(c.host)}, max_batch={c.max_batch}: kernels {kernels}>"
