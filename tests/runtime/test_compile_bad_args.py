"""Issue 26 item 8: fusionc.compile names arguments of the wrong type (InputError, or the
codegen string's CompileError), never AttributeError or TypeError."""
import pytest

import fusionc
from fusionc.errors import CompileError, InputError
from tests.passes.graphs import example


@pytest.fixture(scope="module")
def mlp():
    return example("llama2_7b", hidden=256, heads=2, intermediate=512)["mlp"]


@pytest.mark.parametrize("kw, fragment", [
    (dict(codegen=5), "codegen = 5"), (dict(codegen=object()), "codegen = "),
    (dict(progress=5), "progress = 5"), (dict(pipeline=5), "pipeline = 5"),
    (dict(pdl="yes"), "pdl = 'yes'"), (dict(autotune="x"), "autotune = 'x'")])
def test_arguments_of_the_wrong_type(mlp, kw, fragment):
    with pytest.raises(InputError, match="input error") as info:
        fusionc.compile(mlp, max_batch=4, **kw)
    assert fragment in str(info.value) and info.value.valid


def test_codegen_string(mlp, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSIONC_CACHE_DIR", str(tmp_path))
    fn = fusionc.compile(mlp, max_batch=4, codegen="gemv_unroll=8")
    assert fn.kernels
    with pytest.raises(CompileError, match="codegen option"):
        fusionc.compile(mlp, max_batch=4, codegen="nonsense")
