"""Build steps that pyproject.toml cannot express (all metadata lives there).

`templates/` sits at the repository root; a wheel ships it inside the package as
`fusionc/templates` (copied by :class:`BuildPy`), where :func:`fusionc.paths.templates_dir`
looks first. An editable install copies nothing: it is a plain path entry for the repository
root (setuptools' static ``.pth``), so ``import fusionc`` finds the checkout's package from any
folder, and the templates are found beside the package. (A ``package-dir`` mapping of
``fusionc.templates`` made setuptools install an import hook instead, which comes after the
current directory: there a folder named ``fusionc`` — the checkout itself, seen from its
parent folder — shadowed the package as an empty namespace package.) The path entry also
makes the checkout's ``tests`` and ``benchmarks`` folders importable, as ``PYTHONPATH=$PWD``
does.
"""

import pathlib
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).resolve().parent


class BuildPy(build_py):
    """``build_py`` that also copies ``templates/`` into the built package (not when editable)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dst = pathlib.Path(self.build_lib) / "fusionc" / "templates"
        shutil.copytree(ROOT / "templates", dst, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


# package_dir {"": "."}: the layout setuptools installs editable as a static .pth (the repository
# root on sys.path) rather than as an import hook.
setup(packages=find_packages(include=["fusionc", "fusionc.*"]), package_dir={"": "."},
      cmdclass={"build_py": BuildPy})
