"""Renders the iPXE scripts in ``pxe/*.ipxe.j2`` (jinja2, strict: a missing variable fails)."""

from __future__ import annotations

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

    def render(self, name: str, **values: object) -> str:
        return self._env.get_template(f"{name}.ipxe.j2").render(**values)
