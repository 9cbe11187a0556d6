"""``/sys/class/infiniband``: a host's HCAs from sysfs, without any tool installed.

``read_sysfs_tree(root)`` is the only blocking function in the package (it walks the
directory; call it in an executor); ``parse_sysfs(files)`` is pure and takes its result: a
mapping of paths relative to the root (``mlx5_0/ports/1/state``) to file contents.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from provisioner.topology.model import LinkRate, LocalCa, LocalPort, PortState
from provisioner.topology.parse_common import fail, guarded, guid

SOURCE = "/sys/class/infiniband"
DEVICE_FILES = ("node_guid", "node_desc", "node_type", "fw_ver", "hca_type", "board_id")
PORT_FILES = ("state", "phys_state", "rate", "lid", "link_layer")
_MAX_FILE_BYTES = 4096
_MAX_DEVICES = 256
_MAX_PORTS = 64


def read_sysfs_tree(root: Path | str) -> dict[str, str]:
    """The files ``parse_sysfs`` needs, as text. Unreadable or missing files are skipped;
    symlinked device directories (as in real sysfs) are followed one level."""
    base = Path(root)
    files: dict[str, str] = {}
    try:
        devices = sorted(os.listdir(base))[:_MAX_DEVICES]
    except OSError:
        return files
    for device in devices:
        for name in DEVICE_FILES:
            _read(base, f"{device}/{name}", files)
        try:
            ports = sorted(os.listdir(base / device / "ports"))[:_MAX_PORTS]
        except OSError:
            continue
        for port in ports:
            for name in PORT_FILES:
                _read(base, f"{device}/ports/{port}/{name}", files)
    return files


def _read(base: Path, relative: str, files: dict[str, str]) -> None:
    try:
        with open(base / relative, "rb") as handle:
            files[relative] = handle.read(_MAX_FILE_BYTES).decode("utf-8", "replace")
    except OSError:
        pass


def parse_sysfs(files: Mapping[str, str], source: str = SOURCE) -> tuple[LocalCa, ...]:
    return guarded(source, lambda: _parse(files, source))


def _parse(files: Mapping[str, str], source: str) -> tuple[LocalCa, ...]:
    devices = sorted({path.split("/", 1)[0] for path in files if "/" in path})
    found = (_device(files, name, source) for name in devices)
    cas = [ca for ca in found if ca is not None]
    if not cas:
        raise fail(source, 0, "no InfiniBand device (no <device>/node_guid or ports/)")
    return tuple(cas)


def _device(files: Mapping[str, str], name: str, source: str) -> LocalCa | None:
    def read(relative: str) -> str:
        return files.get(f"{name}/{relative}", "").strip()

    numbers = sorted({int(p.split("/")[2]) for p in files
                      if p.startswith(f"{name}/ports/") and p.count("/") == 3
                      and p.split("/")[2].isdigit()})
    node_guid = read("node_guid")
    if not node_guid and not numbers:
        return None
    ports = tuple(_port(read, number) for number in numbers)
    return LocalCa(name, ports, ca_type=read("hca_type"),
                   node_guid=guid(node_guid.replace(":", ""), f"{source}/{name}/node_guid", 1)
                   if node_guid else None,
                   firmware=read("fw_ver"), description=read("node_desc"))


def _port(read: Callable[[str], str], number: int) -> LocalPort:
    prefix = f"ports/{number}"
    lid = read(f"{prefix}/lid")
    return LocalPort(number, PortState.parse(read(f"{prefix}/state")),
                     read(f"{prefix}/phys_state").split(":")[-1].strip(),
                     LinkRate.from_sysfs(read(f"{prefix}/rate")),
                     int(lid, 16) if lid.lower().startswith("0x") and _hex(lid[2:]) else None,
                     None, read(f"{prefix}/link_layer"))


def _hex(text: str) -> bool:
    return bool(text) and all(c in "0123456789abcdefABCDEF" for c in text)
