"""setuptools hook (the rest is pyproject.toml): the wheel carries ``pxe/``, ``playbooks/``
and ``inventory/`` as package data under ``provisioner/_shipped/``, where
``provisioner/shipped.py`` finds them. They stay at the top of the checkout (the daemon
finds them there in a checkout or an editable install, which this hook leaves alone)."""

from __future__ import annotations

import shutil
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


setup(cmdclass={"build_py": BuildPyWithShipped})
