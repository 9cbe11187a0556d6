"""Where the inspection ramdisk's files come from, per architecture.

The management host's own architecture takes them from the host (``linux-image-amd64``,
``busybox-static``, ``python3``); a foreign one (arm64 for Grace trays, on an amd64 host) from
Debian's ``.deb``s of that architecture, fetched with ``apt-get download`` and unpacked with
``dpkg -x`` into a cached sysroot. Both give the same answers: a kernel, its modules, busybox,
python3 and the shared libraries, as paths of a root directory.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import ProvisionerError


class RamdiskError(ProvisionerError):
    """The ramdisk cannot be built here (a missing package or tool); the text says which."""


@dataclass(frozen=True, slots=True)
class Arch:
    name: str  # "x86_64" or "arm64": what operators type
    deb: str  # Debian's architecture name
    triplet: str  # multiarch directory
    uname: str  # what `uname -m` prints on such a node (facts.cpu.arch)
    kernel_package: str  # Debian's kernel metapackage
    modules: tuple[str, ...]  # loaded at boot, dependencies first
    extra_packages: tuple[str, ...] = ()  # unpacked into a foreign sysroot too
    # loaded only when a Mellanox (PCI vendor 0x15b3) network function is present: the
    # InfiniBand core, the mlx5 HCA driver, and the verbs/MAD interfaces ibstat reads through
    infiniband_modules: tuple[str, ...] = ("ib_core", "mlx5_ib", "ib_uverbs", "ib_umad")


_COMMON_MODULES = ("virtio_net", "virtio_pci", "virtio_blk", "mlx5_core", "nvme", "ahci",
                   "sd_mod", "igb", "ixgbe", "e1000e",
                   "raid0", "raid1", "raid10", "raid456")  # md (with md_mod): the storage job
ARCHES: dict[str, Arch] = {
    "x86_64": Arch("x86_64", "amd64", "x86_64-linux-gnu", "x86_64", "linux-image-amd64",
                   (*_COMMON_MODULES, "e1000")),
    # Grace (GB200/GB300 trays): ConnectX/BlueField are mlx5; qemu's virt machine is virtio.
    "arm64": Arch("arm64", "arm64", "aarch64-linux-gnu", "aarch64", "linux-image-arm64",
                  (*_COMMON_MODULES, "virtio_mmio"),
                  extra_packages=("grub-efi-arm64-bin",)),  # grub-mkimage's arm64-efi modules
}
_ALIASES = {"amd64": "x86_64", "x86-64": "x86_64", "aarch64": "arm64"}
PYTHON_VERSION = "3.11"  # Debian 12's python3; the agent needs only its standard library

#: The disk tools the agent's jobs run (path, Debian package), packed with their shared
#: libraries: the ``sanitise`` job's erase tools, the ``storage`` job's mdadm.
TOOLS: tuple[tuple[str, str], ...] = (("/usr/sbin/nvme", "nvme-cli"),
                                      ("/sbin/hdparm", "hdparm"),
                                      ("/usr/bin/sg_sanitize", "sg3-utils"),
                                      ("/sbin/mdadm", "mdadm"))
# The arm64 packages a foreign-architecture ramdisk is made from (plus the kernel).
FOREIGN_PACKAGES = ("busybox-static", f"python{PYTHON_VERSION}-minimal",
                    f"libpython{PYTHON_VERSION}-minimal", f"libpython{PYTHON_VERSION}-stdlib",
                    "libc6", "zlib1g", "libexpat1", "libssl3", "libffi8", "libbz2-1.0",
                    "liblzma5", "libuuid1", "libzstd1",
                    # the erase tools and what they link (nvme-cli: libnvme, via D-Bus systemd)
                    "nvme-cli", "libnvme1", "libjson-c5", "libdbus-1-3", "libsystemd0",
                    "libcap2", "libgcrypt20", "liblz4-1", "libgpg-error0", "hdparm",
                    "sg3-utils", "libsgutils2-1.46-2",
                    "mdadm", "libudev1")  # the storage job's software RAID


def arch_named(name: str) -> Arch:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in ARCHES:
        raise RamdiskError(f"unknown architecture {name!r}: use x86_64 or arm64")
    return ARCHES[key]


def host_arch() -> Arch | None:
    machine = platform.machine()
    return next((a for a in ARCHES.values() if a.uname == machine), None)


@dataclass(frozen=True, slots=True)
class Sysroot:
    """A root directory holding one architecture's kernel, modules, busybox and python3."""

    arch: Arch
    root: Path
    kernel_version: str
    versions: str  # what the cache key hashes: package versions or .deb names

    @property
    def kernel(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.kernel_version}"

    @property
    def busybox(self) -> Path:
        return self.resolve("/bin/busybox")

    @property
    def python(self) -> str:
        return f"/usr/bin/python{PYTHON_VERSION}"

    def resolve(self, path: str) -> Path:
        """``path`` of the target system as a host path, following its symlinks inside the
        sysroot (an absolute link target is taken relative to the sysroot, never the host)."""
        parts = deque(p for p in path.split("/") if p)
        done, hops = "", 0
        while parts:
            part = parts.popleft()
            if part in (".", ".."):
                done = os.path.dirname(done) if part == ".." else done
                continue
            candidate = f"{done}/{part}"
            host = self.root / candidate.lstrip("/")
            if not host.is_symlink():
                done = candidate
                continue
            hops += 1
            if hops > 40:
                raise RamdiskError(f"too many symbolic links at {path} in {self.root}")
            target = os.readlink(host)
            if target.startswith("/"):
                done = ""
            parts.extendleft(reversed([p for p in target.split("/") if p]))
        return self.root / done.lstrip("/")

    def library_dirs(self) -> list[str]:
        t = self.arch.triplet
        return [f"/lib/{t}", f"/usr/lib/{t}", "/lib", "/usr/lib"]


def host_sysroot(arch: Arch) -> Sysroot:
    """The management host itself, for its own architecture."""
    modules = Path("/lib/modules")
    versions = sorted((p.name for p in modules.iterdir() if (p / "modules.dep").exists()),
                      key=_version_key) if modules.is_dir() else []
    if not versions:
        raise RamdiskError(f"no kernel modules under /lib/modules: install {arch.kernel_package}")
    kver = versions[-1]
    sysroot = Sysroot(arch, Path("/"), kver, "")
    if not sysroot.kernel.is_file():
        raise RamdiskError(f"no kernel at {sysroot.kernel}: install {arch.kernel_package}")
    if not sysroot.busybox.is_file():
        raise RamdiskError("no /bin/busybox: install busybox-static")
    if not Path(sysroot.python).is_file():
        raise RamdiskError(f"no {sysroot.python}: install python3")
    missing = [package for path, package in TOOLS if not Path(path).is_file()]
    if missing:
        raise RamdiskError(f"the agent's disk tools are missing: apt-get install "
                           f"{' '.join(missing)}")
    pkgs = _run(["dpkg-query", "-W", "busybox-static", f"python{PYTHON_VERSION}-minimal",
                 *(package for _, package in TOOLS)], check=False)
    return Sysroot(arch, Path("/"), kver, pkgs)


def fetch_debs(arch: Arch, debs: Path) -> list[str]:
    """The file names of ``arch``'s packages in ``debs``, downloaded with ``apt-get download``
    unless all are there already (an air-gapped site copies them in beforehand)."""
    for tool in ("apt-get", "apt-cache", "dpkg-deb", "depmod"):
        if shutil.which(tool) is None:
            raise RamdiskError(f"{tool} not found: the {arch.name} ramdisk is built from "
                               "Debian packages")
    kernel_pkg = _kernel_package(arch)
    packages = (kernel_pkg, *FOREIGN_PACKAGES, *arch.extra_packages)
    names = [f"{p}:{arch.deb}" for p in packages]
    debs.mkdir(parents=True, exist_ok=True)
    wanted = _deb_files(names)
    if not all((debs / f).is_file() for f in wanted):
        _run(["apt-get", "download", "-q", *names], cwd=debs)
        missing = [f for f in wanted if not (debs / f).is_file()]
        if missing:
            raise RamdiskError(f"apt-get download did not fetch {', '.join(missing)}")
    return wanted


def foreign_sysroot(arch: Arch, cache: Path) -> Sysroot:
    """A sysroot unpacked from ``arch``'s Debian packages, cached under ``cache``."""
    debs = cache / f"debs-{arch.deb}"
    wanted = fetch_debs(arch, debs)
    key = hashlib.sha256("\n".join(sorted(wanted)).encode()).hexdigest()[:12]
    root = cache / f"sysroot-{arch.deb}-{key}"
    if not (root / ".complete").is_file():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        for name in sorted(wanted):
            _run(["dpkg-deb", "-x", str(debs / name), str(root)])
        (root / ".complete").write_text("\n".join(sorted(wanted)) + "\n")
        for stale in cache.glob(f"sysroot-{arch.deb}-*"):
            if stale != root:
                shutil.rmtree(stale, ignore_errors=True)
    kver = _kernel_version(wanted)
    if not (root / "lib/modules" / kver / "modules.dep").is_file():
        _run(["depmod", "-b", str(root), kver])
    return Sysroot(arch, root, kver, "\n".join(sorted(wanted)))


def _kernel_version(debs: list[str]) -> str:
    kernel = next(d for d in debs if d.startswith("linux-image-"))
    return kernel.removeprefix("linux-image-").split("_")[0]


def sysroot_for(arch: Arch, cache: Path) -> Sysroot:
    host = host_arch()
    if host is not None and host.name == arch.name:
        return host_sysroot(arch)
    return foreign_sysroot(arch, cache)


def requirements_hint(arch: Arch) -> str:
    """What an operator installs so that ``arch``'s ramdisk can be built on this host."""
    host = host_arch()
    tools = "cpio kmod binutils"
    if host is not None and host.name == arch.name:
        erasers = " ".join(package for _, package in TOOLS)
        return (f"apt-get install {arch.kernel_package} busybox-static python3 {erasers} "
                f"{tools}")
    return (f"dpkg --add-architecture {arch.deb} && apt-get update && apt-get install {tools} "
            f"(the build downloads {arch.deb} packages with apt-get download)")


def _kernel_package(arch: Arch) -> str:
    out = _run(["apt-cache", "depends", "--important", f"{arch.kernel_package}:{arch.deb}"],
               check=False)
    match = re.search(r"Depends:\s*(linux-image-[\w.+-]+?)(?::\w+)?\s*$", out, re.M)
    if match is None:
        raise RamdiskError(f"apt knows no {arch.kernel_package}:{arch.deb}: "
                           f"{requirements_hint(arch)}")
    return match.group(1)


def _deb_files(names: list[str]) -> list[str]:
    """The file names ``apt-get download`` gives these packages."""
    out = _run(["apt-get", "download", "--print-uris", "-q", *names], check=False)
    files = re.findall(r"^'\S+' (\S+\.deb) ", out, re.M)
    if len(files) != len(names):
        raise RamdiskError(f"apt cannot download {', '.join(names)} "
                           f"(got {len(files)} of {len(names)}): {out.strip()[-300:]}")
    return files


def _version_key(version: str) -> list[int | str]:
    return [int(p) if p.isdigit() else p for p in re.split(r"[.-]", version)]


def _run(cmd: list[str], *, cwd: Path | None = None, check: bool = True) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RamdiskError(f"{' '.join(cmd[:3])} failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    return proc.stdout
