"""Where the files shipped beside the code live: ``pxe/`` (boot and installer templates, the
ramdisk's ``init``), ``playbooks/`` and ``inventory/``.

A source checkout (or an editable install) keeps them next to the package; a wheel carries
them as package data under ``provisioner/_shipped/`` (``setup.py`` copies them there when it
builds); the Debian package installs that wheel into its private virtualenv and links
``/usr/share/provisioner/<name>`` to the same files. Standard library only.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

PACKAGE: Final = Path(__file__).resolve().parent
PACKAGE_DATA: Final = "_shipped"
NAMES: Final = ("pxe", "playbooks", "inventory")


def candidates(name: str) -> list[Path]:
    """Where ``name`` (one of ``NAMES``) may be, in the order they are tried: the checkout,
    the wheel's package data, a data dir of the install prefix, the system's."""
    if name not in NAMES:
        raise ValueError(f"not a shipped directory: {name}")
    return [PACKAGE.parent / name, PACKAGE / PACKAGE_DATA / name,
            Path(sys.prefix) / "share" / "provisioner" / name,
            Path("/usr/share/provisioner") / name]


def find(name: str, marker: str) -> Path:
    """The first candidate dir holding the file ``marker`` (a relative path); the package
    data dir when none does (its absence then shows in the caller's error)."""
    for candidate in candidates(name):
        if (candidate / marker).is_file():
            return candidate
    return PACKAGE / PACKAGE_DATA / name
