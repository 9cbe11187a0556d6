"""Builds the inspection ramdisk for one architecture: Debian's kernel, busybox, python3 with
just the standard library modules the agent imports, the agent, and ``pxe/ramdisk/init``.

    build(arch, out_dir, cache_dir) -> out_dir/vmlinuz, out_dir/initrd.gz

Cached: rebuilt only when the agent, the init scripts, this builder or the Debian packages
change (the key is written beside the files). A build writes into a temporary directory and
renames into place, so a reader (the boot HTTP server) never sees half a ramdisk.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from provisioner import shipped
from provisioner.ramdisk.sysroot import (
    PYTHON_VERSION,
    TOOLS,
    Arch,
    RamdiskError,
    Sysroot,
    sysroot_for,
)

log = logging.getLogger(__name__)
PACKAGE = Path(__file__).resolve().parents[1]  # provisioner/
AGENT = PACKAGE / "agent"
# What the agent imports beyond its own modules (dynamic imports count: they are run).
_IMPORTS = """
import sys
before = set(sys.modules)
import encodings.idna, encodings.ascii, encodings.latin_1, encodings.utf_8
import encodings.utf_16_le  # the GPT partition name of the cloud-init seed
import provisioner.agent.partition, provisioner.agent.qcow2
import provisioner.agent.__main__, provisioner.agent.collect, provisioner.agent.facts
import provisioner.agent.deploy, zlib, hashlib, threading
import http.client, urllib.request, json, subprocess, logging, email.parser
import runpy, importlib.machinery, importlib.util, pkgutil, sysconfig
print(sysconfig.get_config_var("MULTIARCH"))
for name, mod in sorted(sys.modules.items()):
    path = getattr(mod, "__file__", None)
    if path and not name.startswith("provisioner"):
        print(path)
"""


def ramdisk_sources() -> Path:
    """``pxe/ramdisk`` (init, udhcpc.script) of a checkout, else the wheel's package data
    (where ``boot/render.py`` finds the templates: ``provisioner.shipped``)."""
    return shipped.find("pxe", "ramdisk/init") / "ramdisk"


@dataclass(frozen=True, slots=True)
class Target:
    """Where one architecture's ramdisk goes (paths under the artefacts directory)."""

    kernel: Path
    initrd: Path

    @property
    def key_file(self) -> Path:
        return self.initrd.with_name(self.initrd.name + ".key")

    def is_built(self) -> bool:
        return self.kernel.is_file() and self.initrd.is_file()


def build(arch: Arch, target: Target, cache_dir: Path) -> Target:
    """The ramdisk of ``arch`` at ``target`` (built only when its key changed)."""
    sysroot = sysroot_for(arch, cache_dir)
    sources = ramdisk_sources()
    key = cache_key(sysroot, sources)
    if target.is_built() and _read(target.key_file) == key:
        return target
    for tool, package in (("cpio", "cpio"), ("readelf", "binutils"), ("modprobe", "kmod")):
        if shutil.which(tool) is None:
            raise RamdiskError(f"{tool} not found: apt-get install {package}")
    for path in (target.kernel, target.initrd):
        path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".ramdisk-{arch.name}-",
                                     dir=target.initrd.parent) as tmp:
        root = Path(tmp) / "root"
        _assemble(sysroot, sources, root)
        initrd = Path(tmp) / "initrd.gz"
        _pack(root, initrd)
        # beside the target, under a name no other daemon sharing the state dir uses
        kernel = target.kernel.with_name(f".{target.kernel.name}.{os.getpid()}.tmp")
        shutil.copyfile(sysroot.kernel, kernel)
        kernel.replace(target.kernel)
        initrd.replace(target.initrd)
    target.key_file.write_text(key + "\n")
    log.info("built the %s inspection ramdisk: %s (kernel %s), %s (%.1f MiB)", arch.name,
             target.kernel, sysroot.kernel_version, target.initrd,
             target.initrd.stat().st_size / 2**20)
    return target


def cache_key(sysroot: Sysroot, sources: Path) -> str:
    h = hashlib.sha256()
    files = [Path(__file__), Path(__file__).with_name("sysroot.py"), sources / "init",
             sources / "udhcpc.script", *sorted(AGENT.glob("*.py"))]
    for path in files:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(f"\0{sysroot.arch.name}\0{sysroot.kernel_version}\0{sysroot.versions}".encode())
    return h.hexdigest()[:16]


def _assemble(sysroot: Sysroot, sources: Path, root: Path) -> None:
    for d in ("bin", "sbin", "etc", "proc", "sys", "dev", "tmp", "root", "usr/bin",
              "opt/agent/provisioner/agent", "lib/modules"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sysroot.busybox, root / "bin/busybox")
    (root / "bin/busybox").chmod(0o755)
    _install(sources / "init", root / "init", 0o755)
    _install(sources / "udhcpc.script", root / "etc/udhcpc.script", 0o755)
    _copy_modules(sysroot, root)
    python = sysroot.resolve(sysroot.python)
    _install(python, root / "usr/bin/python3", 0o755)
    elves = [python]
    for path, _ in TOOLS:  # nvme, hdparm, sg_sanitize (sanitise), mdadm (storage)
        tool = root / "usr/bin" / Path(path).name
        _install(sysroot.resolve(path), tool, 0o755)
        elves.append(tool)
    for path in _stdlib_files(sysroot):
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sysroot.resolve(path), target)
        if path.endswith(".so"):
            elves.append(target)
    _copy_libraries(sysroot, root, elves)
    for source in sorted(AGENT.glob("*.py")):
        shutil.copyfile(source, root / "opt/agent/provisioner/agent" / source.name)
    (root / "opt/agent/provisioner/__init__.py").write_text('"""provisioner (agent only)."""\n')


def _copy_modules(sysroot: Sysroot, root: Path) -> None:
    """The kernel modules in load order (dependencies first); built-in ones print nothing.
    ``/etc/modules.order`` is loaded at every boot; ``/etc/modules.infiniband`` (the
    InfiniBand stack, less what the first list has) only on a node with a Mellanox HCA."""
    order = module_order(sysroot, sysroot.arch.modules)
    infiniband = [p for p in module_order(sysroot, sysroot.arch.infiniband_modules,
                                          required=True) if p not in order]
    for path in (*order, *infiniband):
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sysroot.resolve(path), target)
    (root / "etc/modules.order").write_text("".join(f"{p}\n" for p in order))
    (root / "etc/modules.infiniband").write_text("".join(f"{p}\n" for p in infiniband))


def module_order(sysroot: Sysroot, modules: tuple[str, ...], *, required: bool = False
                 ) -> list[str]:
    """The module files ``modules`` need, dependencies first (``modprobe --show-depends``
    against the sysroot's own ``modules.dep``: the arm64 one is Debian's arm64 kernel's).
    ``required``: a module the kernel has neither as a file nor built in is an error (the
    InfiniBand stack must not go missing quietly)."""
    order: list[str] = []
    base = [] if sysroot.root == Path("/") else ["-d", str(sysroot.root)]
    for module in modules:
        proc = subprocess.run(["modprobe", *base, "--show-depends", "-S",
                               sysroot.kernel_version, module], capture_output=True, text=True)
        if required and proc.returncode != 0:
            raise RamdiskError(f"kernel {sysroot.kernel_version} ({sysroot.arch.name}) has no "
                               f"module {module}: {proc.stderr.strip()[-200:]}")
        for line in proc.stdout.splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == "insmod":
                path = _strip_root(words[1], sysroot.root)
                if path not in order:
                    order.append(path)
    return order


def _stdlib_files(sysroot: Sysroot) -> list[str]:
    """The standard library files the agent imports, as paths of the target system: found
    by running the imports with the host's Debian python3 of the same version (pure modules
    are the same on every architecture; C extensions differ only by their triplet)."""
    host_python = Path(f"/usr/bin/python{PYTHON_VERSION}")
    if not host_python.is_file():
        raise RamdiskError(f"no {host_python}: apt-get install python{PYTHON_VERSION}")
    proc = subprocess.run([str(host_python), "-S", "-c", _IMPORTS], capture_output=True,
                          text=True, env={"PYTHONPATH": str(PACKAGE.parent)})
    if proc.returncode != 0:
        raise RamdiskError(f"listing the agent's imports failed: {proc.stderr.strip()[-500:]}")
    stdlib = f"/usr/lib/python{PYTHON_VERSION}/"
    host_triplet, *paths = proc.stdout.split()
    files = []
    for path in paths:
        if not path.startswith((stdlib, "/usr/lib/python3/")):
            continue
        target = path.replace(host_triplet, sysroot.arch.triplet)
        if not sysroot.resolve(target).is_file():
            raise RamdiskError(f"{target} is missing from the {sysroot.arch.name} sysroot")
        files.append(target)
    return files


def _copy_libraries(sysroot: Sysroot, root: Path, elves: list[Path]) -> None:
    """Every shared library the ELF files need (transitively) and the dynamic loader,
    found by ``readelf`` (works for any architecture, unlike ldd)."""
    pending, seen = list(elves), set()
    while pending:
        elf = pending.pop()
        headers = subprocess.run(["readelf", "-d", "-l", "-W", str(elf)], capture_output=True,
                                 text=True).stdout
        interp = re.search(r"Requesting program interpreter: (\S+)\]", headers)
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", headers)
        wanted = [(interp.group(1), interp.group(1))] if interp else []
        for name in needed:
            path = _find_library(sysroot, name)
            wanted.append((path, f"/lib/{sysroot.arch.triplet}/{name}"))
        for source, dest in wanted:
            if dest in seen:
                continue
            seen.add(dest)
            target = root / dest.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(sysroot.resolve(source), target)
            target.chmod(0o755)
            pending.append(target)


def _find_library(sysroot: Sysroot, name: str) -> str:
    for directory in sysroot.library_dirs():
        if sysroot.resolve(f"{directory}/{name}").is_file():
            return f"{directory}/{name}"
    raise RamdiskError(f"shared library {name} not found in the {sysroot.arch.name} sysroot")


def _pack(root: Path, initrd: Path) -> None:
    files = subprocess.run(["find", ".", "-print0"], cwd=root, capture_output=True,
                           check=True).stdout
    cpio = subprocess.run(["cpio", "--null", "-o", "-H", "newc", "--quiet", "-R", "0:0"],
                          cwd=root, input=files, capture_output=True)
    if cpio.returncode != 0:
        raise RamdiskError(f"cpio failed: {cpio.stderr.decode(errors='replace')[-300:]}")
    with gzip.open(initrd, "wb", compresslevel=6) as out:
        out.write(cpio.stdout)


def _install(source: Path, target: Path, mode: int) -> None:
    shutil.copyfile(source, target)
    target.chmod(mode)


def _strip_root(path: str, root: Path) -> str:
    prefix = str(root).rstrip("/")
    return path[len(prefix):] if prefix and path.startswith(prefix + "/") else path


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
