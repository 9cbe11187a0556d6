"""Smaller infiniband-diags outputs: ``ibqueryerrors``, ``perfquery``, ``saquery NR``,
``sminfo``, ``ibroute`` and ``ibtracert``. Only ``ibqueryerrors``/``perfquery`` feed the
model (port error counters become findings); the others are parsed so every recorded
fixture has a reader (health checks and tests use them: the SM is master, a route exists).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from provisioner.topology.model import IbNode, IbScan, NodeKind, PortErrors
from provisioner.topology.parse_common import (
    check_text,
    fail,
    guarded,
    guid,
    integer,
    numbered,
)

_ERRORS_FOR = re.compile(r'^Errors for 0x([0-9a-fA-F]+)\s+"(.*)"\s*$')
_ERRORS_PORT = re.compile(r"^GUID 0x([0-9a-fA-F]+) port (\d+|ALL):\s*(.*)$")
_COUNTER = re.compile(r"\[(\w+) == (\d+)\]")
_PERF_HEAD = re.compile(r"^# Port counters: Lid (\d+) port (\d+)")
_PERF_LINE = re.compile(r"^(\w+):\.*(\S+)$")
_SM = re.compile(r"^sminfo: sm lid (\d+) sm guid 0x([0-9a-fA-F]+), activity count (\d+) "
                 r"priority (\d+) state (\d+) (\w+)\s*$")
_ROUTE_HEAD = re.compile(r"^Unicast lids \[[^\]]*\] of switch Lid (\d+) guid 0x([0-9a-fA-F]+)")
_ROUTE = re.compile(r"^0x([0-9a-fA-F]+) (\d+) : \((Channel Adapter|Switch|Router) portguid "
                    r"0x([0-9a-fA-F]+): '(.*)'\)\s*$")
_HOP = re.compile(r'^(?:From|To|\[(\d+)\] ->) (ca|switch|router)(?: port)? \{0x([0-9a-fA-F]+)\}'
                  r'(?:\[(\d+)\])?(?: portnum (\d+))? lid (\d+)-\d+ "(.*)"\s*$')
_KINDS = {"channel adapter": NodeKind.CA, "switch": NodeKind.SWITCH, "router": NodeKind.ROUTER,
          "ca": NodeKind.CA}


@dataclass(frozen=True, slots=True)
class PortCounters:
    lid: int
    port: int
    counters: tuple[tuple[str, int], ...]

    def errors(self) -> dict[str, int]:
        return {k: v for k, v in self.counters
                if v and not k.startswith(("PortXmit", "PortRcvData", "PortRcvPkts", "Counter",
                                           "PortSelect"))}


@dataclass(frozen=True, slots=True)
class SmInfo:
    lid: int
    guid: str
    activity: int
    priority: int
    state: int
    state_name: str

    @property
    def is_master(self) -> bool:
        return self.state_name == "SMINFO_MASTER"


@dataclass(frozen=True, slots=True)
class Route:
    lid: int
    port: int
    kind: NodeKind
    guid: str
    description: str


@dataclass(frozen=True, slots=True)
class Hop:
    kind: NodeKind
    guid: str
    lid: int
    description: str
    out_port: int | None   # the port the previous hop left by (None for From/To)


def parse_ibqueryerrors(text: str, source: str = "ibqueryerrors") -> tuple[PortErrors, ...]:
    check_text(source, text)
    return guarded(source, lambda: _errors(text, source))


def _errors(text: str, source: str) -> tuple[PortErrors, ...]:
    found: list[PortErrors] = []
    summary = False
    description = ""
    for number, line in numbered(text):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("##"):
            summary = summary or "Summary" in stripped
        elif (head := _ERRORS_FOR.match(stripped)) is not None:
            description = head[2].strip()
        elif (port := _ERRORS_PORT.match(stripped)) is not None:
            counters = tuple((name, int(value)) for name, value in _COUNTER.findall(port[3]))
            number_ = None if port[2] == "ALL" else integer(port[2], source, number, "port")
            found.append(PortErrors(guid(port[1], source, number), description, number_,
                                    counters))
        else:
            raise fail(source, number, f"not an ibqueryerrors line: {stripped[:60]!r}")
    if not summary:
        raise fail(source, 0, "no '## Summary' line: output cut short?")
    return tuple(found)


def parse_perfquery(text: str, source: str = "perfquery") -> PortCounters:
    check_text(source, text)
    return guarded(source, lambda: _perf(text, source))


def _perf(text: str, source: str) -> PortCounters:
    head: tuple[int, int] | None = None
    counters: list[tuple[str, int]] = []
    for number, line in numbered(text):
        stripped = line.strip()
        if not stripped:
            continue
        if (match := _PERF_HEAD.match(stripped)) is not None:
            head = (int(match[1]), int(match[2]))
        elif head is not None and (pair := _PERF_LINE.match(stripped)) is not None:
            counters.append((pair[1], integer(pair[2], source, number, pair[1], high=2**64)))
        else:
            raise fail(source, number, f"not a perfquery line: {stripped[:60]!r}")
    if head is None:
        raise fail(source, 0, "no '# Port counters:' header")
    return PortCounters(head[0], head[1], tuple(counters))


def parse_sminfo(text: str, source: str = "sminfo") -> SmInfo:
    check_text(source, text)
    for number, line in numbered(text):
        if (match := _SM.match(line.strip())) is not None:
            return SmInfo(int(match[1]), guid(match[2], source, number), int(match[3]),
                          int(match[4]), int(match[5]), match[6])
        if line.strip():
            raise fail(source, number, f"not an sminfo line: {line.strip()[:60]!r}")
    raise fail(source, 0, "empty sminfo output")


def parse_saquery_nodes(text: str, source: str = "saquery NR") -> IbScan:
    """``saquery NR`` (NodeRecord dump): the devices the subnet manager knows."""
    check_text(source, text)
    return guarded(source, lambda: _saquery(text, source))


def _saquery(text: str, source: str) -> IbScan:
    records: list[dict[str, str]] = []
    for number, line in numbered(text):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped == "NodeRecord dump:":
            records.append({})
        elif records and (match := re.match(r"^(\w+)\.+(.*)$", stripped)) is not None:
            records[-1][match[1]] = match[2].strip()
        else:
            raise fail(source, number, f"not a NodeRecord line: {stripped[:60]!r}")
    nodes = []
    for record in records:
        kind = _KINDS.get(record.get("node_type", "").lower())
        if kind is None or "node_guid" not in record:
            raise fail(source, 0, f"NodeRecord without node_type/node_guid: {record}")
        nodes.append(IbNode(guid(record["node_guid"], source, 0), kind,
                            record.get("NodeDescription", ""),
                            int(record.get("num_ports", "0")), int(record.get("lid", "0"))))
    if not nodes:
        raise fail(source, 0, "no NodeRecord in the input")
    return IbScan(tuple(nodes), source=source)


def parse_ibroute(text: str, source: str = "ibroute") -> tuple[Route, ...]:
    check_text(source, text)
    return guarded(source, lambda: _ibroute(text, source))


def _ibroute(text: str, source: str) -> tuple[Route, ...]:
    routes: list[Route] = []
    header = False
    for number, line in numbered(text):
        stripped = line.strip()
        if not stripped or stripped.startswith(("Lid", "Port")) or "valid lids dumped" in stripped:
            continue
        if _ROUTE_HEAD.match(stripped):
            header = True
        elif header and (match := _ROUTE.match(stripped)) is not None:
            routes.append(Route(int(match[1], 16), int(match[2]), _KINDS[match[3].lower()],
                                guid(match[4], source, number), match[5]))
        else:
            raise fail(source, number, f"not an ibroute line: {stripped[:60]!r}")
    if not header:
        raise fail(source, 0, "no 'Unicast lids ... of switch' header")
    return tuple(routes)


def parse_ibtracert(text: str, source: str = "ibtracert") -> tuple[Hop, ...]:
    check_text(source, text)
    return guarded(source, lambda: _ibtracert(text, source))


def _ibtracert(text: str, source: str) -> tuple[Hop, ...]:
    hops: list[Hop] = []
    for number, line in numbered(text):
        stripped = line.strip()
        if not stripped:
            continue
        match = _HOP.match(stripped)
        if match is None:
            raise fail(source, number, f"not an ibtracert line: {stripped[:60]!r}")
        hops.append(Hop(_KINDS[match[2]], guid(match[3], source, number), int(match[6]),
                        match[7], int(match[1]) if match[1] else None))
    if len(hops) < 2:
        raise fail(source, 0, "a trace needs a From and a To line")
    return tuple(hops)
