"""``import fusionc`` works from any folder, in particular from the one that holds the checkout
(whose folder may be named ``fusionc``); wheels ship the top-level templates/ in the package."""
from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PROBE = ("import fusionc, fusionc.paths; fusionc.f16; fusionc.paths.templates_dir(); "
         "print(fusionc.__file__)")
can_build = importlib.util.find_spec("setuptools") is not None and (
    importlib.util.find_spec("wheel") is not None
    or importlib.util.find_spec("setuptools.command.bdist_wheel") is not None)
needs_build = pytest.mark.skipif(not can_build, reason="setuptools with bdist_wheel (or wheel) "
                                 "is not installed (the dev extra installs it)")


def test_import_from_the_checkouts_parent_folder():
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO.parent, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def _checkout_copy(tmp: pathlib.Path) -> pathlib.Path:
    """The files a build reads, copied to ``tmp/fusionc`` (a checkout folder named as the
    package, the case that an import hook gets wrong)."""
    src = tmp / "fusionc"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("fusionc", "templates"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    return src


def _build(src: pathlib.Path, hook: str, out: pathlib.Path) -> pathlib.Path:
    code = f"from setuptools import build_meta as b; print(b.{hook}({str(out)!r}))"
    r = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return out / r.stdout.split()[-1]


@needs_build
def test_editable_install_imports_from_the_parent_folder(tmp_path):
    src = _checkout_copy(tmp_path)
    whl = _build(src, "build_editable", tmp_path / "dist")
    site = tmp_path / "site"
    with zipfile.ZipFile(whl) as z:
        pth = [n for n in z.namelist() if n.endswith(".pth")]
        assert pth and not [n for n in z.namelist() if n.endswith("_finder.py")], z.namelist()
        z.extractall(site, members=pth)
    # the wheel's path entries first: a venv with another fusionc installed (CI's own editable
    # install of its checkout) must not shadow the wheel under test
    entries = [ln.strip() for n in pth for ln in (site / n).read_text().splitlines()
               if ln.strip() and not ln.startswith(("#", "import"))]
    code = f"import sys; sys.path[1:1] = {entries!r}; " + PROBE
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True)   # cwd holds the checkout folder `fusionc`
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(src / "fusionc" / "__init__.py")


@needs_build
def test_wheel_ships_templates_in_the_package(tmp_path):
    whl = _build(_checkout_copy(tmp_path), "build_wheel", tmp_path / "dist")
    names = set(zipfile.ZipFile(whl).namelist())
    assert {"fusionc/templates/kernel.cu.j2", "fusionc/templates/ops/gemv.cu.j2",
            "fusionc/ir/grammar.lark"} <= names
    assert not any(n.startswith(("templates/", "tests/")) for n in names)
