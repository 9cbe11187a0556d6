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
                      "rotational": _read(dev / "queue/rotational") == "1"})
    return found


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


def infiniband(root: Path) -> list[dict[str, Any]]:
    found = []
    for dev in sorted((root / "sys/class/infiniband").glob("*")):
        guid = _read(dev / "node_guid").replace(":", "")
        ports = []
        for port in sorted((dev / "ports").glob("*"), key=lambda p: p.name):
            if not port.name.isdigit():
                continue
            lid = _read(port / "lid", "0x0")
            ports.append({"port": int(port.name),
                          "state": _read(port / "state").partition(": ")[2] or "unknown",
                          "phys_state": _read(port / "phys_state").partition(": ")[2],
                          "rate": _read(port / "rate"),
                          "lid": int(lid, 16) if lid.startswith("0x") else 0})
        found.append({"device": dev.name, "node_guid": f"0x{guid}", "ports": ports})
    return found


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
