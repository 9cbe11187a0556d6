"""``ibnetdiscover`` output: the default topology file (also ibsim's ``.net`` files, which use
the same grammar), ``-p``/``--ports`` and ``-l``/``--list`` (and ``ibhosts``/``ibswitches``).

``parse_ibnetdiscover`` recognises the form from the first meaningful line.
Topology-file grammar (infiniband-diags 44, fixtures in tests/fixtures/topology/)::

    Switch 65 "S-2c5eab0300b87b40" # "MF0;A09-P1-IBLEAF-04-04:MQM9701/U1" enhanced port 0 lid 73
    [1]  "H-e09d7303007a4bd8"[1](e09d7303007a4bd8)   # "a08-p1-dgx-04-c01 mlx5_5" lid 647 4xNDR
    Ca   1 "H-000000000010001e"   # "gpu-node-16 mlx5_0"
    [1](10001f)  "S-0000000000200003"[4]   # lid 22 lmc 0 "ib-leaf-04" lid 6 4xHDR
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from provisioner.topology.model import IbLink, IbNode, IbScan, LinkRate, NodeKind, PortRef
from provisioner.topology.parse_common import (
    add_link,
    check_text,
    fail,
    guarded,
    guid,
    integer,
    numbered,
)
from provisioner.topology.parse_iblist import LIST_LINE, parse_iblist
from provisioner.topology.parse_ibports import PORTS_LINE, parse_ibnetdiscover_ports

SOURCE = "ibnetdiscover"
_KINDS = {"switch": NodeKind.SWITCH, "ca": NodeKind.CA, "hca": NodeKind.CA, "rt": NodeKind.ROUTER}
_PREFIX_KIND = {"S": NodeKind.SWITCH, "H": NodeKind.CA, "R": NodeKind.ROUTER}
_HEADER = re.compile(r'^(Switch|Ca|Hca|Rt)\s+(\d+)\s+"([^"]*)"\s*(?:#\s*(.*))?$', re.IGNORECASE)
_PORT = re.compile(r'^\[(\d+)\](?:\([0-9a-fA-F]+\))?\s*"([^"]*)"\[(\d+)\]'
                   r'(?:\([0-9a-fA-F]+\))?\s*(?:#\s*(.*))?$')
_ATTR = re.compile(r"^(vendid|devid|sysimgguid|switchguid|caguid|routerguid)\s*=", re.IGNORECASE)
_QUOTED = re.compile(r'"([^"]*)"')
_LID = re.compile(r"\blid\s+(\d+)")
_ID = re.compile(r"^([SHR])-([0-9a-fA-F]{1,16})$")


def parse_ibnetdiscover(text: str, source: str = SOURCE) -> IbScan:
    """Any of the three forms; a TopologyParseError names the line that is not one of them."""
    check_text(source, text)
    for _number, line in numbered(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if PORTS_LINE.match(stripped):
            return parse_ibnetdiscover_ports(text, source)
        if LIST_LINE.match(stripped):
            return parse_iblist(text, source)
        break
    return parse_topology_file(text, source)


def parse_topology_file(text: str, source: str = SOURCE) -> IbScan:
    check_text(source, text)
    return guarded(source, lambda: _TopologyFile(source).parse(text))


@dataclass
class _TopologyFile:
    source: str
    nodes: dict[str, IbNode] = field(default_factory=dict)
    seen: dict[str, IbNode] = field(default_factory=dict)   # peers known only from comments
    links: dict[tuple[PortRef, PortRef], IbLink] = field(default_factory=dict)
    current: IbNode | None = None

    def parse(self, text: str) -> IbScan:
        for number, line in numbered(text):
            stripped = line.strip()
            if not stripped or stripped.startswith("#") or _ATTR.match(stripped):
                continue
            if (header := _HEADER.match(stripped)) is not None:
                self._header(header, number)
            elif (port := _PORT.match(stripped)) is not None:
                self._port(port, number)
            else:
                raise fail(self.source, number, f"not an ibnetdiscover line: {stripped[:60]!r}")
        if not self.nodes:
            raise fail(self.source, 0, "no Switch, Ca or Rt record in the input")
        peers = {k: v for k, v in self.seen.items() if k not in self.nodes}
        nodes = tuple(sorted({**self.nodes, **peers}.values(), key=lambda n: n.guid))
        return IbScan(nodes, tuple(self.links.values()), source=self.source)

    def _header(self, match: re.Match[str], number: int) -> None:
        kind = _KINDS[match[1].lower()]
        ports = integer(match[2], self.source, number, "port count", high=255)
        node_id, comment = match[3], match[4] or ""
        quoted = _QUOTED.search(comment)
        description = (quoted[1] if quoted else node_id).strip()
        lid = _LID.search(comment[quoted.end():] if quoted else comment)
        node = IbNode(self._key(node_id, number), kind, description, ports,
                      int(lid[1]) if lid else None)
        if node.guid in self.nodes:
            raise fail(self.source, number, f"device {node_id!r} listed twice")
        self.nodes[node.guid] = node
        self.current = node

    def _port(self, match: re.Match[str], number: int) -> None:
        if self.current is None:
            raise fail(self.source, number, "port line before any Switch/Ca record")
        local = integer(match[1], self.source, number, "port", high=255)
        remote_port = integer(match[3], self.source, number, "remote port", high=255)
        if local > (self.current.ports or 255):
            raise fail(self.source, number, f"port {local} beyond the device's port count")
        peer = self._key(match[2], number)
        comment = match[4] or ""
        quoted = _QUOTED.findall(comment)
        description = quoted[-1].strip() if quoted else match[2]
        tokens = comment.split()
        rate = LinkRate.from_token(tokens[-1]) if tokens else None
        prefix = _ID.match(match[2])
        kind = _PREFIX_KIND[prefix[1].upper()] if prefix else NodeKind.SWITCH
        self.seen.setdefault(peer, IbNode(peer, kind, description))
        link = IbLink(PortRef(self.current.guid, local), PortRef(peer, remote_port), rate)
        add_link(self.links, link)

    def _key(self, node_id: str, number: int) -> str:
        """``S-<hex>``/``H-<hex>`` → the GUID; an ibsim name → ``id:<name>``."""
        match = _ID.match(node_id)
        if match is not None:
            return guid(match[2], self.source, number)
        if not node_id.strip():
            raise fail(self.source, number, "empty device id")
        return f"id:{node_id.strip()}"
