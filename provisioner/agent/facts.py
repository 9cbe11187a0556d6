"""The facts schema: what an agent may report, checked field by field. Standard library only.

Shared by the agent (which builds reports) and the daemon (which refuses malformed or lying
ones with a reason naming the field)."""

from __future__ import annotations

import re
from typing import Any

MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
HEX_ID_RE = re.compile(r"^0x[0-9a-f]{4}$")
GUID_RE = re.compile(r"^0x[0-9a-f]{16}$")
MAX_DISK_BYTES = 1 << 50  # 1 PiB: a bigger single disk is a lie
MAX_MEMORY_MIB = 64 << 20  # 64 TiB
MAX_CPUS = 4096
MAX_ITEMS = 512
MAX_NVIDIA_SMI_XML_BYTES = 8 << 20  # 8 MiB: a GB200/HGX node's full report is well under 1
MAX_DCGM_SUMMARY = 4096


class FactsError(ValueError):
    """A report that does not fit the schema; the message names the field."""


def validate(facts: object, *, booting_mac: str | None = None) -> dict[str, Any]:
    """Return the facts when they fit; raise FactsError naming the first bad field.

    ``booting_mac``: the MAC the node booted with; the report must list it among its NICs."""
    if not isinstance(facts, dict):
        raise FactsError("facts: must be an object")
    unknown = set(facts) - _SECTIONS.keys()
    if unknown:
        raise FactsError(f"facts: unknown field {sorted(unknown)[0]!r}")
    for name, check in _SECTIONS.items():
        if name in facts:
            check(facts[name], name)
    for required in ("system", "cpu", "memory_mib", "nics"):
        if required not in facts:
            raise FactsError(f"{required}: missing")
    if booting_mac is not None:
        macs = {nic["mac"] for nic in facts["nics"]}
        if booting_mac not in macs:
            raise FactsError(f"nics: the booting MAC {booting_mac} is not among the "
                             f"reported NICs ({', '.join(sorted(macs)) or 'none'})")
    return facts


def _str(value: object, where: str, *, max_len: int = 256, empty: bool = True) -> None:
    if not isinstance(value, str) or len(value) > max_len or (not empty and not value):
        raise FactsError(f"{where}: must be a string of at most {max_len} characters")


def _int(value: object, where: str, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise FactsError(f"{where}: must be an integer from {lo} to {hi}")


def _obj(value: object, where: str, fields: dict[str, Any], required: tuple[str, ...]) -> None:
    if not isinstance(value, dict):
        raise FactsError(f"{where}: must be an object")
    for key in value:
        if key not in fields:
            raise FactsError(f"{where}.{key}: unknown field")
    for key in required:
        if key not in value:
            raise FactsError(f"{where}.{key}: missing")
    for key, check in fields.items():
        if key in value:
            check(value[key], f"{where}.{key}")


def _list(value: object, where: str, item: Any) -> None:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise FactsError(f"{where}: must be a list of at most {MAX_ITEMS} items")
    for index, element in enumerate(value):
        item(element, f"{where}[{index}]")


def _pattern(regex: re.Pattern[str]) -> Any:
    def check(value: object, where: str) -> None:
        if not isinstance(value, str) or not regex.match(value):
            raise FactsError(f"{where}: {value!r} is not of the form {regex.pattern}")
    return check


def _text(max_len: int = 256) -> Any:
    return lambda value, where: _str(value, where, max_len=max_len)


def _bool(value: object, where: str) -> None:
    if not isinstance(value, bool):
        raise FactsError(f"{where}: must be true or false")


def _num(lo: int, hi: int) -> Any:
    return lambda value, where: _int(value, where, lo, hi)


def _system(value: object, where: str) -> None:
    _obj(value, where, {"vendor": _text(), "model": _text(), "serial": _text(128),
                        "uuid": _text(64)}, ("serial",))


def _cpu(value: object, where: str) -> None:
    _obj(value, where, {"model": _text(), "sockets": _num(1, 64), "cores": _num(1, MAX_CPUS),
                        "threads": _num(1, MAX_CPUS), "arch": _text(32)}, ("cores",))


def _disk(value: object, where: str) -> None:
    _obj(value, where, {"name": _text(64), "size_bytes": _num(0, MAX_DISK_BYTES),
                        "model": _text(), "serial": _text(128), "rotational": _bool,
                        "wwn": _text(128), "partitions": _num(0, 4096),
                        "signature": _text(16)}, ("name", "size_bytes"))


def _nic(value: object, where: str) -> None:
    _obj(value, where, {"name": _text(32), "mac": _pattern(MAC_RE), "driver": _text(64),
                        "speed_mbps": _num(0, 10_000_000), "link": _bool,
                        "lldp": _text(1024)}, ("mac",))


def _pci(value: object, where: str) -> None:
    _obj(value, where, {"address": _text(32), "vendor": _pattern(HEX_ID_RE),
                        "device": _pattern(HEX_ID_RE), "class": _text(16)},
         ("vendor", "device"))


def _gpu(value: object, where: str) -> None:
    _obj(value, where, {"pci_address": _text(32), "vendor": _pattern(HEX_ID_RE),
                        "device": _pattern(HEX_ID_RE), "name": _text()}, ("vendor", "device"))


def _hca(value: object, where: str) -> None:
    _obj(value, where, {"device": _text(64), "node_guid": _pattern(GUID_RE),
                        "state": _text(32), "rate_gbps": _num(0, 10_000),
                        "ports": lambda v, w: _list(v, w, _hca_port)}, ("device",))


def _hca_port(value: object, where: str) -> None:
    _obj(value, where, {"port": _num(1, 255), "state": _text(32), "phys_state": _text(32),
                        "rate": _text(64), "lid": _num(0, 65535), "link_layer": _text(32)},
         ("port",))


def _ib_driver(value: object, where: str) -> None:
    """Whether an InfiniBand driver was loaded where the facts were read (the ramdisk loads
    it only for the Mellanox HCAs it finds): without one, no port list says anything."""
    _obj(value, where, {"loaded": _bool, "modules": lambda v, w: _list(v, w, _text(32)),
                        "mellanox_functions": _num(0, 4096)}, ("loaded",))


def _bmc(value: object, where: str) -> None:
    _obj(value, where, {"ip": _text(45), "mac": _pattern(MAC_RE)}, ())


def _nvidia_smi_xml(value: object, where: str) -> None:
    """``nvidia-smi -q -x`` verbatim (the validation gate and the live topology parse it)."""
    if not isinstance(value, str):
        raise FactsError(f"{where}: must be a string")
    if len(value) > MAX_NVIDIA_SMI_XML_BYTES or len(value.encode()) > MAX_NVIDIA_SMI_XML_BYTES:
        raise FactsError(f"{where}: larger than {MAX_NVIDIA_SMI_XML_BYTES} bytes")


def _nvidia_smi_errors(value: object, where: str) -> None:
    """nvidia-smi's own error lines (``Unable to determine the device handle for GPU …: GPU
    is lost``): the validation gate fails the node with them."""
    _list(value, where, _text(512))


def _imex(value: object, where: str) -> None:
    """GB200/GB300 prerequisites as the ``facts`` role saw them (systemd unit states)."""
    _obj(value, where, {"package": _bool, "service_enabled": _text(32),
                        "service_active": _text(32), "fabricmanager_enabled": _text(32),
                        "fabricmanager_active": _text(32)}, ("package",))


def _dcgm_diag(value: object, where: str) -> None:
    """``dcgmi diag -r <level>`` as the node judged it: whether it ran, passed, and why not
    (DCGM's own reasons), and the level (1 when absent)."""
    _obj(value, where, {"ran": _bool, "passed": _bool, "summary": _text(MAX_DCGM_SUMMARY),
                        "level": _num(1, 4)}, ("ran", "passed"))


_SECTIONS: dict[str, Any] = {
    "system": _system,
    "cpu": _cpu,
    "memory_mib": _num(1, MAX_MEMORY_MIB),
    "disks": lambda v, w: _list(v, w, _disk),
    "nics": lambda v, w: _list(v, w, _nic),
    "pci": lambda v, w: _list(v, w, _pci),
    "gpus": lambda v, w: _list(v, w, _gpu),
    "infiniband": lambda v, w: _list(v, w, _hca),
    "infiniband_driver": _ib_driver,
    "bmc": _bmc,
    "nvidia_smi_xml": _nvidia_smi_xml,
    "nvidia_smi_errors": _nvidia_smi_errors,
    "dcgm_diag": _dcgm_diag,
    "imex": _imex,
}
