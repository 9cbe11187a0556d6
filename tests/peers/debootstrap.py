"""A Debian root made by ``debootstrap``, cached between test runs (the Ansible target).

Cached under ``${XDG_CACHE_HOME:-$HOME/.cache}/provisioner/debootstrap-<suite>``. The cache
is robust: concurrent builders are serialised by ``flock``; a root is built in a temporary
sibling and renamed into place only after ``debootstrap`` succeeded and its stamp (suite,
variant, packages) was written, so an interrupted build is never used; a stamp that does not
match (the package list changed) rebuilds; leftovers of a crashed build are unmounted before
they are removed. Tests never write into the cached root: they mount an overlay over it.

Measured on the CI machine type (2 cores, deb.debian.org, 476 MB root): cold build 61-92 s,
warm (stamp check) 0.2 ms; a test's overlay + sshd start in ~0.1 s, stop in ~0.03 s.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

SUITE: Final = "bookworm"
VARIANT: Final = "minbase"
# What the playbooks expect the image to ship (packages are not installed in the tests:
# the target has no network). python3-apt: Ansible's apt module; openssh-server: the sshd
# the tests log in through; systemd: unit enablement works offline.
PACKAGES: Final = ("python3", "python3-apt", "openssh-server", "systemd", "chrony",
                   "containerd", "kmod", "procps", "iproute2", "ca-certificates", "gnupg",
                   "curl")
MIRROR: Final = os.environ.get("PROVISIONER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BUILD_TIMEOUT_S: Final = 900
_STAMP: Final = ".provisioner-debootstrap.json"


@dataclass(frozen=True, slots=True)
class DebianRoot:
    path: Path
    built_s: float | None  # seconds spent building now; None: taken from the cache


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "provisioner"


def debootstrap_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "debootstrap, overlay mounts and namespaces need root (CI runs as root)"
    for tool in ("debootstrap", "unshare", "ip", "socat", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} not found: apt-get install (scripts/setup.sh APT_PACKAGES)"
    return None


def _wanted(suite: str, packages: tuple[str, ...]) -> dict[str, object]:
    return {"suite": suite, "variant": VARIANT, "packages": sorted(packages)}


def _stamp_ok(root: Path, suite: str, packages: tuple[str, ...]) -> bool:
    try:
        return bool(json.loads((root / _STAMP).read_text()) == _wanted(suite, packages))
    except (OSError, ValueError):
        return False


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def unmount_under(path: Path) -> None:
    """Lazily unmount everything mounted below ``path`` (debootstrap killed half-way
    leaves proc/sys mounted in the target; rmtree must never walk into those)."""
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        points = [line.split()[1].replace("\\040", " ") for line in fh]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def _remove(path: Path) -> None:
    if path.exists():
        unmount_under(path)
        shutil.rmtree(path, ignore_errors=True)


def ensure_debian_root(suite: str = SUITE, packages: tuple[str, ...] = PACKAGES,
                       name: str = "") -> DebianRoot:
    """The cached root for ``suite`` with ``packages`` (another set: another ``name``, a
    root of its own, ``debootstrap-<suite>-<name>``), built first if missing or stale."""
    root = cache_dir() / (f"debootstrap-{suite}-{name}" if name else f"debootstrap-{suite}")
    if _stamp_ok(root, suite, packages):
        return DebianRoot(root, None)
    with _locked(root.with_name(root.name + ".lock")):
        if _stamp_ok(root, suite, packages):  # another worker built it while we waited
            return DebianRoot(root, None)
        for stale in root.parent.glob(root.name + ".tmp-*"):
            _remove(stale)
        started = time.monotonic()
        building = root.with_name(f"{root.name}.tmp-{os.getpid()}")
        try:
            _debootstrap(suite, building, packages)
            (building / _STAMP).write_text(json.dumps(_wanted(suite, packages)))
        except BaseException:
            _remove(building)
            raise
        _remove(root)
        building.rename(root)
        return DebianRoot(root, time.monotonic() - started)


def _debootstrap(suite: str, target: Path, packages: tuple[str, ...]) -> None:
    log = target.with_name(target.name + ".log")
    cmd = ["debootstrap", f"--variant={VARIANT}", "--include=" + ",".join(packages), suite,
           str(target), MIRROR]
    with log.open("wb") as out:
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                                timeout=BUILD_TIMEOUT_S, check=False,
                                env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    text = log.read_text(errors="replace")
    log.unlink()
    if result.returncode != 0:
        raise RuntimeError(f"debootstrap {suite} failed (rc {result.returncode}):\n"
                           + "\n".join(text.splitlines()[-20:]))
