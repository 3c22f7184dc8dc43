"""Locations of fusionc's data files, valid in a checkout and after any kind of install."""

from __future__ import annotations

import pathlib

_PKG = pathlib.Path(__file__).resolve().parent


def templates_dir() -> pathlib.Path:
    """Return the folder that holds the Jinja `*.cu.j2` templates.

    After a non-editable install the templates lie inside the package (`fusionc/templates`,
    copied there by setup.py's build step); in a checkout (PYTHONPATH or an editable install,
    which is a path entry for the repository root) they are `templates/` at the repository
    root, beside the `fusionc/` folder.
    """
    for candidate in (_PKG / "templates", _PKG.parent / "templates"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"fusionc templates not found: looked in {_PKG / 'templates'} and {_PKG.parent / 'templates'}"
    )
