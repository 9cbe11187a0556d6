"""setuptools hook (the rest is pyproject.toml): the wheel carries ``pxe/``, ``playbooks/``
and ``inventory/`` as package data under ``provisioner/_shipped/``, where
``provisioner/shipped.py`` finds them. They stay at the top of the checkout (the daemon
finds them there in a checkout or an editable install, which this hook leaves alone).

It also writes the man page, ``provisioner/_shipped/man/provisioner.1``, generated from the
command's own argparse parser by argparse-manpage (a build requirement in pyproject.toml);
scripts/build-deb.sh installs it as ``/usr/share/man/man1/provisioner.1.gz``."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("pxe", "playbooks", "inventory")


class BuildPyWithShipped(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "provisioner" / "_shipped"
        for name in SHIPPED:
            dest = target / name
            if dest.exists():
                shutil.rmtree(dest)
            # copy2 keeps the modes: pxe/ramdisk/init and inventory/provisioner.py stay
            # executable in the wheel
            shutil.copytree(ROOT / name, dest,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.retry"))
        write_manpage(target / "man" / "provisioner.1")


def write_manpage(path: Path) -> None:
    """``provisioner(1)`` from ``provisioner.cli.build_parser`` (standard library only, so
    the source tree imports in the build's isolated environment)."""
    from argparse_manpage.manpage import Manpage

    sys.path.insert(0, str(ROOT))
    try:
        from provisioner import __version__
        from provisioner.cli import build_parser

        page = Manpage(build_parser(), {
            "project_name": "provisioner", "version": __version__,
            "manual_title": "provisioner manual", "manual_section": 1})
    finally:
        sys.path.remove(str(ROOT))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(page), encoding="utf-8")


setup(cmdclass={"build_py": BuildPyWithShipped})
