"""Renders the iPXE scripts in ``pxe/*.ipxe.j2`` and the installer documents in
``pxe/install/`` (jinja2, strict: a missing variable fails). Filters for values placed in
other languages: ``sh`` (one shell word), ``json`` (a JSON string, also a YAML scalar)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import jinja2


def default_templates_dir() -> Path:
    """``pxe/`` of a source checkout, else the installed ``share/provisioner/pxe``."""
    checkout = Path(__file__).resolve().parents[2] / "pxe"
    if checkout.is_dir():
        return checkout
    return Path(sys.prefix) / "share" / "provisioner" / "pxe"


class Renderer:
    def __init__(self, templates_dir: Path | None = None) -> None:
        self._env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(templates_dir or default_templates_dir())),
            undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
            trim_blocks=True, lstrip_blocks=True)
        self._env.filters["sh"] = lambda value: shlex.quote(str(value))
        self._env.filters["json"] = lambda value: json.dumps(value, ensure_ascii=True)

    def render(self, name: str, **values: object) -> str:
        return self._env.get_template(f"{name}.ipxe.j2").render(**values)

    def render_document(self, path: str, **values: object) -> str:
        """A template by its path under the templates dir (``install/ks.cfg.j2``)."""
        return self._env.get_template(path).render(**values)
