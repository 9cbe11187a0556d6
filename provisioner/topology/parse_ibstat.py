"""``ibstat`` and ``ibstatus``: a host's own HCAs and their ports (state, rate, GUIDs).

ibstat (infiniband-diags)::

    CA 'mlx5_0'
        CA type: MT4129
        Node GUID: 0xa088c20300e3142a
        Port 1:
            State: Active
            Physical state: LinkUp
            Rate: 400
            Port GUID: 0xa288c2fffee3142a
            Link layer: InfiniBand

ibstatus (a shell script over sysfs)::

    Infiniband device 'mlx5_0' port 1 status:
        state:       4: ACTIVE
        rate:        400 Gb/sec (4X NDR)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from provisioner.topology.model import LinkRate, LocalCa, LocalPort, PortState
from provisioner.topology.parse_common import (
    check_text,
    fail,
    guarded,
    guid,
    integer,
    key_value,
    numbered,
)

_CA = re.compile(r"^CA\s+'([^']+)'\s*$")
_PORT = re.compile(r"^Port\s+(\d+)\s*:\s*$")
# ibstat's fatal error (infiniband-diags IBPANIC): "ibpanic: [1234] main: stat of IB device
# 'mlx5_1' failed: No such file or directory"; what came before it is not the whole host
_PANIC = re.compile(r"^(?:ibpanic:\s*(?:\[\d+\]\s*)?(?:\w+:\s*)?)?(.*\bIB device '([^']+)'.*|.*)$")
_STATUS = re.compile(r"^Infiniband device\s+'([^']+)'\s+port\s+(\d+)\s+status:\s*$")


def parse_ibstat(text: str, source: str = "ibstat") -> tuple[LocalCa, ...]:
    check_text(source, text)
    return guarded(source, lambda: _Ibstat(source).parse(text))


@dataclass
class _Ibstat:
    source: str
    cas: list[LocalCa] = field(default_factory=list)
    port: dict[str, str] | None = None
    port_number: int = 0

    def parse(self, text: str) -> tuple[LocalCa, ...]:
        for number, line in numbered(text):
            stripped = line.strip()
            if not stripped:
                continue
            if (ca := _CA.match(stripped)) is not None:
                self._flush()
                self.cas.append(LocalCa(ca[1], ()))
            elif (port := _PORT.match(stripped)) is not None and self.cas:
                self._flush()
                self.port_number = integer(port[1], self.source, number, "port", high=255)
                self.port = {}
            elif stripped.startswith("ibpanic:") or (
                    stripped.startswith("stat of IB device") and "failed" in stripped):
                raise _panic(self.source, number, stripped)
            elif (pair := key_value(stripped)) is not None and self.cas:
                self._field(number, *pair)
            else:
                raise fail(self.source, number, f"not an ibstat line: {stripped[:60]!r}")
        self._flush()
        if not self.cas:
            raise fail(self.source, 0, "no CA in the input")
        return tuple(self.cas)

    def _field(self, number: int, key: str, value: str) -> None:
        if self.port is not None:
            self.port[key.lower()] = value
            return
        ca, lowered = self.cas[-1], key.lower()
        if lowered == "ca type":
            self.cas[-1] = replace(ca, ca_type=value)
        elif lowered == "node guid":
            self.cas[-1] = replace(ca, node_guid=guid(value, self.source, number))
        elif lowered == "firmware version":
            self.cas[-1] = replace(ca, firmware=value)

    def _flush(self) -> None:
        if self.port is None:
            return
        fields, self.port = self.port, None
        rate = fields.get("rate", "")
        lid = fields.get("base lid", "")
        port_guid = fields.get("port guid")
        local = LocalPort(
            self.port_number, PortState.parse(fields.get("state", "")),
            fields.get("physical state", ""),
            LinkRate.nominal(float(rate)) if _is_number(rate) else None,
            int(lid, 0) if _is_number(lid) else None,
            guid(port_guid, self.source, 0) if port_guid else None,
            fields.get("link layer", ""))
        ca = self.cas[-1]
        self.cas[-1] = replace(ca, ports=(*ca.ports, local))


def _panic(source: str, number: int, line: str) -> Exception:
    """ibstat stopped on a device (it reports no partial host): the error names it."""
    match = _PANIC.match(line)
    message = " ".join((match[1] if match else line).split())[:200]
    device = match[2] if match and match[2] else None
    where = f"device {device}" if device else "a device"
    return fail(source, number, f"ibstat failed on {where}: {message}")


def _is_number(text: str) -> bool:
    try:
        float(text) if "." in text else int(text, 0)
    except ValueError:
        return False
    return True


def parse_ibstatus(text: str, source: str = "ibstatus") -> tuple[LocalCa, ...]:
    check_text(source, text)
    return guarded(source, lambda: _parse_ibstatus(text, source))


def _parse_ibstatus(text: str, source: str) -> tuple[LocalCa, ...]:
    cas: dict[str, list[LocalPort]] = {}
    current: tuple[str, int, dict[str, str]] | None = None
    blocks: list[tuple[str, int, dict[str, str]]] = []
    for number, line in numbered(text):
        stripped = line.strip()
        if not stripped:
            continue
        if (head := _STATUS.match(stripped)) is not None:
            current = (head[1], integer(head[2], source, number, "port", high=255), {})
            blocks.append(current)
        elif current is not None and (pair := key_value(stripped)) is not None:
            current[2][pair[0].lower()] = pair[1]
        elif stripped.lower().startswith("fatal"):
            raise fail(source, number, f"ibstatus reported {' '.join(stripped.split())!r}")
        else:
            raise fail(source, number, f"not an ibstatus line: {stripped[:60]!r}")
    if not blocks:
        raise fail(source, 0, "no device in the input")
    for name, port, fields in blocks:
        lid = fields.get("base lid", "")
        cas.setdefault(name, []).append(LocalPort(
            port, PortState.parse(fields.get("state", "")),
            fields.get("phys state", "").split(":")[-1].strip(),
            LinkRate.from_sysfs(fields.get("rate", "")),
            int(lid, 0) if _is_number(lid) else None, None, fields.get("link_layer", "")))
    return tuple(LocalCa(name, tuple(ports)) for name, ports in cas.items())
