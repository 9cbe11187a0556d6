"""Renders the iPXE scripts in ``pxe/*.ipxe.j2``, their GRUB twins ``*.grub.j2`` and the
installer documents in ``pxe/install/`` (jinja2, strict: a missing variable fails). Filters
for values placed in other languages: ``sh`` (one shell word), ``json`` (a JSON string, also
a YAML scalar), ``grub`` (one GRUB word), ``grub_words`` (each word quoted), ``grub_url``
(``(http,host:port)/path``), ``ipxe_text`` (free text on one iPXE ``echo`` line)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jinja2

from provisioner import shipped
from provisioner.boot.policy import grub_url


def default_templates_dir() -> Path:
    """``pxe/`` of a source checkout, else the wheel's package data (``provisioner.shipped``)."""
    return shipped.find("pxe", "boot.ipxe.j2")


def grub_quote(value: object) -> str:
    """One GRUB script word: single-quoted, so ``;``, ``$`` and spaces stay text; a line
    break cannot end the command (it becomes a space), other control characters become
    ``?``."""
    text = _printable(" ".join(str(value).splitlines()))
    return "'" + text.replace("'", "'\\''") + "'"


def ipxe_text(value: object) -> str:
    """Free text on an iPXE ``echo`` line: one line (breaks become spaces), no control
    characters, and no ``$`` (iPXE would expand ``${...}``)."""
    return _printable(" ".join(str(value).splitlines())).replace("$", "?")


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in text)


class Renderer:
    def __init__(self, templates_dir: Path | None = None) -> None:
        self._env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(templates_dir or default_templates_dir())),
            undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
            trim_blocks=True, lstrip_blocks=True)
        self._env.filters["sh"] = lambda value: shlex.quote(str(value))
        self._env.filters["json"] = lambda value: json.dumps(value, ensure_ascii=True)
        self._env.filters["grub"] = grub_quote
        self._env.filters["ipxe_text"] = ipxe_text
        self._env.filters["grub_words"] = lambda value: " ".join(
            grub_quote(word) for word in str(value).split())
        self._env.filters["grub_url"] = grub_url

    def render(self, name: str, **values: object) -> str:
        return self._env.get_template(f"{name}.ipxe.j2").render(**values)

    def render_grub(self, name: str, **values: object) -> str:
        """``pxe/<name>.grub.j2``: the GRUB twin of an iPXE script (arm64 nodes)."""
        return self._env.get_template(f"{name}.grub.j2").render(**values)

    def render_document(self, path: str, **values: object) -> str:
        """A template by its path under the templates dir (``install/ks.cfg.j2``)."""
        return self._env.get_template(path).render(**values)
