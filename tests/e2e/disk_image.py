"""Builds the e2e test's bootable raw OS image, without root or loop devices: an MBR with
syslinux's boot code, one FAT partition (mkfs.vfat --offset, files put in with mtools,
``syslinux --offset``) holding the Debian kernel the ramdisk uses and a busybox initramfs.

The initramfs's init is the "OS": it finds the ``cidata`` seed partition the agent added,
reads its hostname from ``meta-data`` and the callback URL and token from
``provisioner.env``, takes a DHCP lease and POSTs ``{"event": "booted", "hostname": ...}``.
Cached under ~/.cache/provisioner/disk-image/<key>/disk.raw (key: this file + kernel +
busybox versions).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("virtio_pci", "virtio_blk", "virtio_net", "isofs")
TOOLS = ("sfdisk", "mkfs.vfat", "mcopy", "syslinux", "cpio", "modprobe", "busybox")
MBR = Path("/usr/lib/syslinux/mbr/mbr.bin")
IMAGE_MIB = 24

INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
while read -r m; do insmod "$m" 2>/dev/null; done < /etc/modules.order
echo "disk-os: booted from disk"
mkdir -p /seed
for try in 1 2 3 4 5 6 7 8 9 10; do
  dev=$(findfs LABEL=cidata 2>/dev/null)
  [ -n "$dev" ] && mount -t iso9660 -o ro "$dev" /seed && break
  sleep 1
done
[ -f /seed/meta-data ] || { echo "disk-os: no cidata seed"; blkid; sleep 5; poweroff -f; }
host=$(sed -n 's/.*"local-hostname": "\([^"]*\)".*/\1/p' /seed/meta-data)
. /seed/provisioner.env
hostname "$host"
echo "disk-os: seed on $dev, hostname $(hostname)"
ip link set lo up
for dev in /sys/class/net/*; do
  [ "${dev##*/}" = lo ] || iface=${dev##*/}
done
ip link set "$iface" up
udhcpc -i "$iface" -s /etc/udhcpc.script -t 10 -T 2 -n -q
body="{\"event\": \"booted\", \"hostname\": \"$(hostname)\"}"
for try in $(seq 30); do
  if wget -q -O /dev/null --header "Authorization: Bearer $PROVISIONER_TOKEN" \
      --header "Content-Type: application/json" --post-data "$body" \
      "$PROVISIONER_CALLBACK_URL"; then
    echo "disk-os: callback sent"; break
  fi
  sleep 2
done
while true; do sleep 3600; done
"""

SYSLINUX_CFG = """SERIAL 0 115200
DEFAULT os
PROMPT 0
TIMEOUT 0
LABEL os
  KERNEL vmlinuz
  APPEND initrd=initrd.gz console=ttyS0 panic=5
"""


def missing_tool() -> str | None:
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} not found (scripts/setup.sh installs it)"
    if not MBR.is_file():
        return f"{MBR} not found (syslinux-common)"
    return None


def _kernel() -> tuple[str, Path]:
    version = sorted(os.listdir("/lib/modules"), key=_version_key)[-1]
    return version, Path(f"/boot/vmlinuz-{version}")


def _version_key(name: str) -> list[int]:
    return [int(part) for part in name.replace("-", ".").split(".") if part.isdigit()]


def build_disk_image(cache: Path | None = None) -> Path:
    """The image's path (built once per key)."""
    version, kernel = _kernel()
    key = hashlib.sha256(Path(__file__).read_bytes() + version.encode() + subprocess.run(
        ["busybox"], capture_output=True).stdout[:80]).hexdigest()[:16]
    base = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    out = base / "provisioner" / "disk-image" / key
    image = out / "disk.raw"
    if image.is_file():
        return image
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "initrd.gz").write_bytes(_initramfs(work / "root", version))
    (work / "syslinux.cfg").write_text(SYSLINUX_CFG)
    raw = work / "disk.raw"
    raw.write_bytes(b"")
    os.truncate(raw, IMAGE_MIB << 20)
    subprocess.run(["sfdisk", "-q", str(raw)], input=b"label: dos\n2048,,e,*\n", check=True)
    subprocess.run(["mkfs.vfat", "-F", "16", "--offset", "2048", "-n", "DISKOS", str(raw),
                    str((IMAGE_MIB - 1) * 1024)], check=True, capture_output=True)
    target = f"{raw}@@{1 << 20}"
    subprocess.run(["mcopy", "-i", target, str(kernel), "::vmlinuz"], check=True)
    subprocess.run(["mcopy", "-i", target, str(work / "initrd.gz"),
                    str(work / "syslinux.cfg"), "::"], check=True)
    subprocess.run(["syslinux", "--offset", str(1 << 20), "--install", str(raw)], check=True)
    with raw.open("r+b") as disk:
        disk.write(MBR.read_bytes()[:440])
    raw.rename(image)
    shutil.rmtree(work)
    return image


def _initramfs(root: Path, version: str, sysroot: Path = Path("/")) -> bytes:
    """The disk OS's initramfs: busybox, INIT and the modules, from ``sysroot`` (the host, or
    an unpacked arm64 sysroot)."""
    for sub in ("bin", "etc", "proc", "sys", "dev", "seed"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy(sysroot / "bin" / "busybox", root / "bin" / "busybox")
    (root / "init").write_text(INIT)
    (root / "init").chmod(0o755)
    shutil.copy(ROOT / "pxe" / "ramdisk" / "udhcpc.script", root / "etc" / "udhcpc.script")
    order: list[str] = []
    base = [] if sysroot == Path("/") else ["-d", str(sysroot)]
    for module in MODULES:
        shown = subprocess.run(["modprobe", *base, "--show-depends", "-S", version, module],
                               capture_output=True, text=True, check=False).stdout
        for line in shown.splitlines():
            words = line.split()
            if words[:1] == ["insmod"]:
                ko = words[1].removeprefix(str(sysroot).rstrip("/"))
                if ko not in order:
                    order.append(ko)
    for ko in order:
        (root / ko.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(sysroot / ko.lstrip("/"), root / ko.lstrip("/"))
    (root / "etc" / "modules.order").write_text("".join(f"{ko}\n" for ko in order))
    listing = subprocess.run(["find", ".", "-print0"], cwd=root, capture_output=True,
                             check=True).stdout
    archive = subprocess.run(["cpio", "--null", "-o", "-H", "newc", "--quiet"], cwd=root,
                             input=listing, capture_output=True, check=True).stdout
    return gzip.compress(archive, 6)


# arm64 (Grace): a GPT disk whose EFI System Partition holds the removable-media boot path
# EFI/BOOT/BOOTAA64.EFI (a GRUB image with its configuration embedded), the Debian arm64
# kernel and the same busybox initramfs, from the unpacked arm64 sysroot.
ARM64_GRUB_CFG = """set timeout=0
echo "disk-os: GRUB from the disk"
linux /vmlinuz console=ttyAMA0 panic=5
initrd /initrd.gz
boot
"""
ARM64_IMAGE_MIB = 64  # Debian's arm64 kernel is an uncompressed Image (~32 MiB)
ARM64_GRUB_MODULES = ("part_gpt", "fat", "linux", "normal", "echo", "gzio", "configfile",
                      "efi_gop", "serial", "terminal")


def build_arm64_disk_image(sysroot: Path, kernel_version: str, cache: Path) -> Path:
    """A bootable arm64 raw image (cached in ``cache`` by this file and the kernel)."""
    key = hashlib.sha256(Path(__file__).read_bytes() + kernel_version.encode()).hexdigest()[:16]
    image = cache / f"disk-arm64-{key}.raw"
    if image.is_file():
        return image
    work = cache / f"disk-arm64-{key}.work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "initrd.gz").write_bytes(_initramfs(work / "root", kernel_version, sysroot))
    (work / "grub.cfg").write_text(ARM64_GRUB_CFG)
    efi = work / "BOOTAA64.EFI"
    subprocess.run(["grub-mkimage", "-O", "arm64-efi", "-d",
                    str(sysroot / "usr/lib/grub/arm64-efi"), "-o", str(efi), "-c",
                    str(work / "grub.cfg"), "-p", "/EFI/BOOT", *ARM64_GRUB_MODULES], check=True)
    raw = work / "disk.raw"
    raw.write_bytes(b"")
    os.truncate(raw, ARM64_IMAGE_MIB << 20)
    # one EFI System Partition from 1 MiB to the end (the agent grows it and adds the seed)
    subprocess.run(["sfdisk", "-q", str(raw)], check=True,
                   input=b"label: gpt\n2048,,U\n")
    subprocess.run(["mkfs.vfat", "-F", "16", "--offset", "2048", "-n", "DISKOS", str(raw),
                    str((ARM64_IMAGE_MIB - 2) * 1024)], check=True, capture_output=True)
    target = f"{raw}@@{1 << 20}"
    subprocess.run(["mmd", "-i", target, "::EFI", "::EFI/BOOT"], check=True)
    subprocess.run(["mcopy", "-i", target, str(efi), "::EFI/BOOT/BOOTAA64.EFI"], check=True)
    kernel = sysroot / "boot" / f"vmlinuz-{kernel_version}"
    subprocess.run(["mcopy", "-i", target, str(kernel), "::vmlinuz"], check=True)
    subprocess.run(["mcopy", "-i", target, str(work / "initrd.gz"), "::initrd.gz"], check=True)
    raw.rename(image)
    shutil.rmtree(work)
    return image
