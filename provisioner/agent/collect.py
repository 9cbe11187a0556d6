"""Gathers facts from /sys and /proc (and ipmitool when present). Standard library only.

``root`` lets tests point it at a copied tree; on a node it is ``/``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from provisioner.agent.gpu_ids import model_name

NVIDIA = "0x10de"
_CLASS_NET = 0x02
_CLASS_DISPLAY = 0x03


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return default


def collect(root: Path = Path("/")) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "system": system(root),
        "cpu": cpu(root),
        "memory_mib": memory_mib(root),
        "disks": disks(root),
        "nics": nics(root),
        "pci": pci(root),
        "infiniband": infiniband(root),
        "infiniband_driver": infiniband_driver(root),
    }
    facts["gpus"] = gpus(facts["pci"])
    bmc = bmc_lan(root)
    if bmc:
        facts["bmc"] = bmc
    return facts


def gpus(devices: list[dict[str, str]]) -> list[dict[str, str]]:
    """NVIDIA display/3D controllers, named by model (``NVIDIA H100 80GB HBM3``) from the
    device ID table, as nvidia-smi names them once the driver is up."""
    return [{"pci_address": dev["address"], "vendor": dev["vendor"], "device": dev["device"],
             "name": model_name(dev["device"])}
            for dev in devices
            if dev["vendor"] == NVIDIA and dev["class"].startswith("0x03")]


def system(root: Path) -> dict[str, str]:
    dmi = root / "sys/class/dmi/id"
    return {"vendor": _read(dmi / "sys_vendor"), "model": _read(dmi / "product_name"),
            "serial": _read(dmi / "product_serial"), "uuid": _read(dmi / "product_uuid")}


def cpu(root: Path) -> dict[str, Any]:
    text = _read(root / "proc/cpuinfo")
    processors = re.findall(r"^processor\s*:", text, re.M)
    models = re.findall(r"^model name\s*:\s*(.+)$", text, re.M)
    sockets = set(re.findall(r"^physical id\s*:\s*(\d+)$", text, re.M))
    return {"model": models[0].strip()[:256] if models else "", "sockets": max(1, len(sockets)),
            "cores": max(1, len(processors)), "arch": os.uname().machine}


def memory_mib(root: Path) -> int:
    match = re.search(r"^MemTotal:\s+(\d+) kB", _read(root / "proc/meminfo"), re.M)
    return max(1, int(match.group(1)) // 1024) if match else 1


def disks(root: Path) -> list[dict[str, Any]]:
    found = []
    for dev in sorted((root / "sys/block").glob("*")):
        if dev.name.startswith(("loop", "ram", "zram", "dm-", "sr", "fd")):
            continue
        sectors = _read(dev / "size", "0")
        found.append({"name": dev.name, "size_bytes": int(sectors) * 512 if sectors.isdigit()
                      else 0, "model": _read(dev / "device/model"),
                      "serial": _read(dev / "device/serial"),
                      "rotational": _read(dev / "queue/rotational") == "1",
                      "partitions": sum(1 for part in dev.iterdir()
                                        if (part / "partition").is_file()),
                      "signature": disk_signature(root / "dev" / dev.name)})
    return found


#: (offset, magic, name): what the first sectors of a disk in use carry; read without blkid
#: (the ramdisk has none): GPT's header at LBA 1 (512- or 4096-byte sectors), LVM2's label in
#: sector 1, XFS and ext2/3/4 superblocks of a file system made on the whole disk
_SIGNATURES = ((512, b"EFI PART", "gpt"), (4096, b"EFI PART", "gpt"),
               (536, b"LVM2 001", "lvm2"), (0, b"XFSB", "xfs"), (1080, b"\x53\xef", "ext"))
_PROBE_BYTES = 4104


def disk_signature(device: Path) -> str:
    """``gpt``, ``mbr``, ``lvm2``, ``xfs``, ``ext``: what says the disk holds data; "" for
    none (a blank disk) or an unreadable one."""
    try:
        with device.open("rb") as disk:
            head = disk.read(_PROBE_BYTES)
    except OSError:
        return ""
    for offset, magic, name in _SIGNATURES:
        if head[offset:offset + len(magic)] == magic:
            return name
    # an MBR: the boot signature and at least one partition entry with a type
    if head[510:512] == b"\x55\xaa" and any(head[446 + 16 * i + 4] for i in range(4)):
        return "mbr"
    return ""


def nics(root: Path) -> list[dict[str, Any]]:
    found = []
    for dev in sorted((root / "sys/class/net").glob("*")):
        if not (dev / "device").exists():  # lo, bridges, veths: not hardware
            continue
        speed = _read(dev / "speed", "0")
        driver = Path(os.readlink(dev / "device/driver")).name if (
            dev / "device/driver").is_symlink() else ""
        found.append({"name": dev.name, "mac": _read(dev / "address").lower(),
                      "driver": driver, "speed_mbps": int(speed) if speed.isdigit() else 0,
                      "link": _read(dev / "carrier") == "1"})
    return found


def pci(root: Path) -> list[dict[str, str]]:
    found = []
    for dev in sorted((root / "sys/bus/pci/devices").glob("*")):
        found.append({"address": dev.name, "vendor": _read(dev / "vendor"),
                      "device": _read(dev / "device"), "class": _read(dev / "class")})
    return found


MELLANOX = "0x15b3"
#: The InfiniBand stack as /sys/module shows it: the core, the verbs/MAD user interfaces that
#: ibstat and sysfs readers need, and the HCA drivers (providers) that create the devices.
IB_CORE_MODULES = ("ib_core", "ib_uverbs", "ib_umad", "ib_ipoib")
IB_PROVIDERS = ("mlx5_ib", "mlx4_ib", "irdma", "bnxt_re", "hfi1", "ib_qib", "efa", "erdma",
                "qedr", "iw_cxgb4", "ocrdma", "vmw_pvrdma", "mana_ib", "hns_roce_hw_v2",
                "rdma_rxe", "siw")


def infiniband(root: Path) -> list[dict[str, Any]]:
    """Every device under /sys/class/infiniband with its ports (``link_layer`` included:
    the Ethernet ports of the same cards, a BlueField bond, are not InfiniBand). A field
    that cannot be read is left out, never written malformed: one bad file must not make
    the daemon refuse the whole report."""
    found = []
    for dev in sorted((root / "sys/class/infiniband").glob("*"))[:512]:
        hca: dict[str, Any] = {"device": dev.name[:64]}
        guid = _read(dev / "node_guid").replace(":", "").lower()
        if re.fullmatch(r"[0-9a-f]{16}", guid):
            hca["node_guid"] = f"0x{guid}"
        ports = (p for p in (dev / "ports").glob("*") if p.name.isdigit()
                 and 1 <= int(p.name) <= 255)
        hca["ports"] = [_ib_port(port) for port in sorted(ports, key=lambda p: int(p.name))]
        found.append(hca)
    return found


def _ib_port(port: Path) -> dict[str, Any]:
    entry: dict[str, Any] = {"port": int(port.name),
                             "state": _words(_read(port / "state"))[:32] or "unknown"}
    for key, limit in (("phys_state", 32), ("rate", 64), ("link_layer", 32)):
        value = _read(port / key)
        value = _words(value) if key == "phys_state" else value
        if value:
            entry[key] = value[:limit]
    lid = _read(port / "lid")
    if re.fullmatch(r"0x[0-9a-fA-F]{1,4}", lid):
        entry["lid"] = int(lid, 16)
    return entry


def _words(value: str) -> str:
    """``4: ACTIVE`` -> ``ACTIVE`` (sysfs prefixes the number); a bare word is kept."""
    return value.partition(": ")[2].strip() or value


def infiniband_driver(root: Path) -> dict[str, Any]:
    """Whether an InfiniBand driver is loaded: an HCA driver (provider) with the core, or a
    device already registered; the IB modules loaded; and how many Mellanox network
    functions are on PCI (the ramdisk loads the stack only when it finds one)."""
    loaded = sorted(name for name in (*IB_CORE_MODULES, *IB_PROVIDERS)
                    if (root / "sys/module" / name).is_dir())
    devices = any((root / "sys/class/infiniband").glob("*"))
    functions = sum(1 for dev in (root / "sys/bus/pci/devices").glob("*")
                    if _read(dev / "vendor") == MELLANOX
                    and _read(dev / "class").startswith("0x02"))
    return {"loaded": devices or ("ib_core" in loaded and any(
                name in IB_PROVIDERS for name in loaded)),
            "modules": loaded, "mellanox_functions": min(functions, 4096)}


def bmc_lan(root: Path) -> dict[str, str]:
    """The BMC's address from ``ipmitool lan print`` when the node can read it."""
    if root != Path("/") or shutil.which("ipmitool") is None:
        return {}
    try:
        out = subprocess.run(["ipmitool", "lan", "print"], capture_output=True, text=True,
                             timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    ip = re.search(r"^IP Address\s*:\s*([0-9.]+)", out, re.M)
    mac = re.search(r"^MAC Address\s*:\s*([0-9a-f:]{17})", out, re.M | re.I)
    result = {}
    if ip and ip.group(1) != "0.0.0.0":
        result["ip"] = ip.group(1)
    if mac:
        result["mac"] = mac.group(1).lower()
    return result
