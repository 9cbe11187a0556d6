"""The built wheel and the wheels of its dependencies, for tests that install provisioner the
way an operator does (a clean virtualenv, the Debian package's private one).

``build_wheel`` builds from a copy of this checkout (the test never writes ``build/`` or
``*.egg-info`` into the tree). ``wheelhouse`` holds every dependency as a wheel, cached under
``${XDG_CACHE_HOME:-~/.cache}/provisioner/wheelhouse-<key>`` (key: pyproject's dependency
list, the interpreter's version and platform), so an install from it is ``pip install
--no-index`` and needs no network after the first run (which fills it from PyPI or pip's
cache). Measured on the CI machine type (2 cores): wheel build ~10 s, cold wheelhouse ~60 s,
warm 0.1 ms.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Final

from tests.peers.debootstrap import _locked, cache_dir

ROOT: Final = Path(__file__).resolve().parents[2]
_NOT_SOURCE: Final = shutil.ignore_patterns(
    ".git", ".ci", "build", "dist", "*.egg-info", ".venv", ".state", "__pycache__", "*.pyc",
    ".mypy_cache", ".ruff_cache", ".pytest_cache", ".import_linter_cache")
#: what the wheelhouse holds besides the dependencies: pyproject's build requirements (the
#: backend, argparse-manpage) and ``wheel`` (scripts/build-deb.sh builds with pip's build
#: isolation, which then needs no index either)
BUILD_REQUIRES: Final = (
    *tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"], "wheel")
_TIMEOUT_S: Final = 900


def pip_env(**extra: str) -> dict[str, str]:
    """The environment for a pip or an installed provisioner: no PYTHONPATH (the tests'
    points at this checkout), no prompts."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONASYNCIODEBUG")}
    env.update(PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def copy_source(dest: Path) -> Path:
    """This checkout without its caches and build outputs."""
    shutil.copytree(ROOT, dest, ignore=_NOT_SOURCE, symlinks=True)
    return dest


def build_wheel(out: Path, source: Path | None = None) -> Path:
    """``pip wheel --no-deps`` of a copy of this checkout (or of ``source``), in pip's build
    isolation with the backend from the wheelhouse; its path."""
    src = source or copy_source(out.parent / "src")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
                    "--find-links", str(wheelhouse()), "-w", str(out), str(src)],
                   check=True, env=pip_env(), timeout=_TIMEOUT_S, capture_output=True)
    (wheel,) = out.glob("provisioner-*.whl")
    return wheel


def _requirements() -> list[str]:
    """The dependencies, the ``postgres`` extra's (the Debian package carries it) and the
    build backend."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["postgres"],
            *BUILD_REQUIRES]


def _key() -> str:
    text = "\n".join([*_requirements(), sys.version, platform.machine()])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def wheelhouse() -> Path:
    """The cached dir of dependency wheels (built first when missing)."""
    house = cache_dir() / f"wheelhouse-{_key()}"
    stamp = house / ".complete"
    if stamp.is_file():
        return house
    with _locked(house.with_name(house.name + ".lock")):
        if stamp.is_file():
            return house
        building = house.with_name(f"{house.name}.tmp-{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(building),
                        *_requirements()],
                       check=True, env=pip_env(), timeout=_TIMEOUT_S, capture_output=True)
        (building / ".complete").write_text(_key() + "\n")
        shutil.rmtree(house, ignore_errors=True)
        building.rename(house)
    return house


def install_into_new_venv(venv: Path, wheel: Path) -> Path:
    """A virtualenv (no system site-packages) with ``wheel`` installed from the wheelhouse
    alone; its ``bin/provisioner``."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120,
                   env=pip_env(), capture_output=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--find-links", str(wheelhouse()), str(wheel)],
                   check=True, env=pip_env(), timeout=_TIMEOUT_S, capture_output=True)
    return venv / "bin" / "provisioner"
