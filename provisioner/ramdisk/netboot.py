"""The first-stage boot loaders the daemon serves over TFTP (and HTTP for UEFI HTTP boot):
copies of the iPXE binaries, and for arm64 (Grace) a GRUB image the daemon makes itself.

Debian has no arm64 iPXE, so arm64 UEFI clients get GRUB: ``grub-mkimage -O arm64-efi`` with
the modules of Debian's ``grub-efi-arm64-bin`` (unpacked from its arm64 ``.deb``) and an
embedded configuration that fetches the node's own ``grub.cfg`` from the daemon's HTTP server:
``/boot/<mac>.grub``, rendered per node like the iPXE scripts. The same image serves PXE
(GRUB knows the booting NIC from the firmware's DHCP answer) and UEFI HTTP boot, where GRUB
cannot find a configuration by itself. The image is unsigned: with Secure Boot on, the
firmware refuses it (docs/operator-guide.md).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from provisioner.boot.policy import grub_url
from provisioner.ramdisk.sysroot import RamdiskError, Sysroot

log = logging.getLogger(__name__)
ARM64_GRUB = "grubaa64.efi"
IPXE_SUFFIXES = (".kpxe", ".efi", ".pxe", ".lkrn")
# Built in, so the image needs no module files next to it (TFTP or HTTP alike).
GRUB_MODULES = ("efinet", "net", "tftp", "http", "linux", "normal", "configfile", "echo",
                "test", "sleep", "reboot", "halt", "gzio", "regexp", "efi_gop", "serial",
                "terminal", "minicmd", "part_gpt", "part_msdos", "fat", "ext2", "search",
                "chain")


def embedded_config(base_url: str) -> str:
    """The script inside the arm64 GRUB image: ask the daemon for this MAC's grub.cfg."""
    try:
        script_dir = grub_url(f"{base_url.rstrip('/')}/boot")
    except ValueError as exc:
        raise RamdiskError(str(exc)) from None
    # GRUB runs an embedded configuration with its rescue parser: plain commands only (no
    # `if`, no loops). GRUB's HTTP client gives up quickly on a busy server, so it asks three
    # times before it reboots (back to the firmware's DHCP) rather than stopping at a prompt.
    fetch = f"configfile {script_dir}/${{net_default_mac}}.grub\n"
    return (
        "set timeout=0\n"
        f"echo \"provisioner: asking {base_url} for the configuration of $net_default_mac\"\n"
        + fetch + "sleep 2\n" + fetch + "sleep 5\n" + fetch
        + "echo \"provisioner: no configuration; rebooting in 10 s\"\n"
        "sleep 10\n"
        "reboot\n")


def grub_modules_dir(sysroot: Sysroot) -> Path:
    return sysroot.resolve("/usr/lib/grub/arm64-efi")


def build_arm64_grub(sysroot: Sysroot, base_url: str, out: Path) -> Path:
    """``out`` = the arm64 GRUB image for ``base_url`` (rebuilt when the URL or the modules
    changed)."""
    modules = grub_modules_dir(sysroot)
    if not (modules / "kernel.img").is_file():
        raise RamdiskError(f"no arm64-efi GRUB modules in {modules}: the arm64 sysroot "
                           "needs grub-efi-arm64-bin")
    if shutil.which("grub-mkimage") is None:
        raise RamdiskError("grub-mkimage not found: apt-get install grub-common")
    config = embedded_config(base_url)
    key = hashlib.sha256(config.encode() + (modules / "kernel.img").read_bytes()
                         + " ".join(GRUB_MODULES).encode()).hexdigest()[:16]
    key_file = out.with_name(out.name + ".key")
    if out.is_file() and key_file.is_file() and key_file.read_text().strip() == key:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".grub-") as tmp:
        cfg, image = Path(tmp) / "embedded.cfg", Path(tmp) / ARM64_GRUB
        cfg.write_text(config)
        proc = subprocess.run(["grub-mkimage", "-O", "arm64-efi", "-d", str(modules), "-o",
                               str(image), "-c", str(cfg), "-p", "/grub", *GRUB_MODULES],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RamdiskError(f"grub-mkimage failed: {proc.stderr.strip()[-400:]}")
        image.replace(out)
    # beside it, for a site that signs its own image (Secure Boot): grub-mkimage -c this file
    out.with_name(out.name + ".cfg").write_text(config)
    key_file.write_text(key + "\n")
    log.info("built the arm64 GRUB netboot image %s (configuration from %s)", out, base_url)
    return out


def stage_ipxe(assets_dir: Path, netboot_dir: Path) -> list[str]:
    """Copies of the iPXE binaries in ``netboot_dir`` (the TFTP root is a jail: links out of
    it are refused, so they are copied, and only when they changed)."""
    netboot_dir.mkdir(parents=True, exist_ok=True)
    staged = []
    for source in sorted(assets_dir.iterdir()) if assets_dir.is_dir() else []:
        if not source.is_file() or not source.name.endswith(IPXE_SUFFIXES):
            continue
        target = netboot_dir / source.name
        stat = source.stat()
        if not target.is_file() or target.stat().st_size != stat.st_size or \
                target.stat().st_mtime < stat.st_mtime:
            # a name of its own: daemons sharing a state dir may stage at the same moment
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            shutil.copyfile(source, tmp)
            tmp.replace(target)
        staged.append(source.name)
    return staged
