"""The Jinja environment over ``templates/`` (``fusionc.paths.templates_dir``)."""
from __future__ import annotations

import functools

import jinja2

from fusionc.paths import templates_dir


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """Templates are C++ with Jinja statements on their own lines; undefined names are errors."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=False, autoescape=False)


def render(template: str, **context) -> str:
    """Render ``template`` (a path under templates/, e.g. ``ops/load.cu.j2``)."""
    return environment().get_template(template).render(**context).rstrip("\n")
