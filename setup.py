"""Package list for setuptools (all other metadata lives in pyproject.toml).

`templates/` sits at the repository root but ships inside the package as `fusionc.templates`
(see `fusionc.paths.templates_dir`), subfolders included; pyproject's `packages.find` cannot
add such a mapped package next to the discovered ones, so the list is built here.
"""

import pathlib

from setuptools import find_packages, setup

root = pathlib.Path(__file__).resolve().parent
template_pkgs = ["fusionc.templates"] + [
    ".".join(("fusionc.templates", *d.relative_to(root / "templates").parts))
    for d in sorted((root / "templates").rglob("*"))
    if d.is_dir() and d.name != "__pycache__"
]

setup(packages=find_packages(include=["fusionc*"]) + template_pkgs)
