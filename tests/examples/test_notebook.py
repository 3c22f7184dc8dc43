"""examples/walkthrough.ipynb runs headlessly from top to bottom (DSL → interpreter → lowering →
simulator → NVRTC cubin → CPU decode), as a new user would run it."""
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # a kernel, NVRTC and a CPU decode: seconds

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "walkthrough.ipynb"


def test_walkthrough_notebook_executes():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    limit = sys.getrecursionlimit()
    try:
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    finally:  # the Jupyter client raises it to 3000 in this process; other tests rely on 1000
        sys.setrecursionlimit(limit)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "simulator vs float64" in text and "tokens:" in text
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "<details" in html and "kernel @" in html      # IR and kernels render as HTML
