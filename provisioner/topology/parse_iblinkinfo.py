"""``iblinkinfo`` (default, grouped by device) and ``iblinkinfo -l`` (one line per port)::

    CA: gpu-node-16 mlx5_0:
      0x000000000010001f 22 1[ ] ==( 4X 53.125 Gbps Active/ LinkUp)==> 6 4[ ] "ib-leaf-04" ( )
    Switch: 0x0000000000200003 ib-leaf-04:
      6 7[ ] ==(     Down/ Polling)==>    [ ] "" ( )
    0x0000000000200003 "  ib-leaf-04"  6 1[ ] ==( 4X 53.125 Gbps Active/ LinkUp)==>
      0x0000000000100019 19 1[ ] "gpu-node-13 mlx5_0" ( )        (-l: one line, cut here)

The speed column is the per-lane signalling rate (HDR prints ``53.125 Gbps``). Peers are
named by LID in the default form: resolved against the LIDs the output itself shows.
A CA is identified by its port GUID here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from provisioner.topology.model import (
    IbLink,
    IbNode,
    IbPortStatus,
    IbScan,
    LinkRate,
    NodeKind,
    PortRef,
    PortState,
)
from provisioner.topology.parse_common import (
    add_link,
    check_text,
    fail,
    guarded,
    guid,
    integer,
    numbered,
)

SOURCE = "iblinkinfo"
_HEADER = re.compile(r"^(CA|Switch|Router):\s*(?:0x([0-9a-fA-F]+)\s+)?(.*?):?\s*$")
_LOCAL_LIST = re.compile(r'^0x([0-9a-fA-F]+)\s+"(.*?)"\s+(\d+)\s+(\d+)\[[^\]]*\]\s*'
                         r"==\((.*?)\)==>\s*(.*)$")
_LOCAL = re.compile(r"^(?:0x([0-9a-fA-F]+)\s+)?(\d+)\s+(\d+)\[[^\]]*\]\s*==\((.*?)\)==>\s*(.*)$")
_PEER = re.compile(r'^(?:0x([0-9a-fA-F]+)\s+)?(\d+)\s+(\d+)\[[^\]]*\]\s+"(.*)"\s*\(.*\)\s*$')
_NO_PEER = re.compile(r'^\[[^\]]*\]\s+"(.*)"\s*\(.*\)\s*$')
_LINK = re.compile(r"^\s*(?:(\d+)X\s+([\d.]+)\s+Gbps\s+)?([A-Za-z]+)\s*/\s*([A-Za-z]+)\s*$")
_KINDS = {"CA": NodeKind.CA, "Switch": NodeKind.SWITCH, "Router": NodeKind.ROUTER}


def parse_iblinkinfo(text: str, source: str = SOURCE) -> IbScan:
    check_text(source, text)
    return guarded(source, lambda: _Parser(source).parse(text))


@dataclass
class _Port:
    here: PortRef
    rate: LinkRate | None
    state: PortState
    physical: str
    peer_guid: str | None = None
    peer_lid: int | None = None
    peer_port: int | None = None
    peer_description: str = ""


@dataclass
class _Parser:
    source: str
    nodes: dict[str, IbNode] = field(default_factory=dict)
    lids: dict[int, str] = field(default_factory=dict)
    ports: list[_Port] = field(default_factory=list)
    kind: NodeKind | None = None
    header_guid: str | None = None
    description: str = ""

    def parse(self, text: str) -> IbScan:
        for number, line in numbered(text):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            if (header := _HEADER.match(stripped)) is not None and "==(" not in stripped:
                self.kind = _KINDS[header[1]]
                self.header_guid = guid(header[2], self.source, number) if header[2] else None
                self.description = header[3].strip()
            elif (listed := _LOCAL_LIST.match(stripped)) is not None:
                here = guid(listed[1], self.source, number)
                self._local(number, here, NodeKind.SWITCH, listed[2].strip(),
                            listed.group(3, 4, 5, 6))
            elif (local := _LOCAL.match(stripped)) is not None:
                self._grouped(number, local)
            else:
                raise fail(self.source, number, f"not an iblinkinfo line: {stripped[:60]!r}")
        if not self.nodes:
            raise fail(self.source, 0, "no device in the input")
        return self._scan()

    def _grouped(self, number: int, local: re.Match[str]) -> None:
        if self.kind is None:
            raise fail(self.source, number, "port line before any CA:/Switch: header")
        here = guid(local[1], self.source, number) if local[1] else self.header_guid
        if here is None:
            raise fail(self.source, number, "port line without a GUID under a CA: header")
        self._local(number, here, self.kind, self.description, local.group(2, 3, 4, 5))

    def _local(self, number: int, here: str, kind: NodeKind, description: str,
               fields: tuple[str | Any, ...]) -> None:
        lid_text, port_text, link_text, peer_text = (f or "" for f in fields)
        lid = integer(lid_text, self.source, number, "LID", high=0xFFFF)
        port = integer(port_text, self.source, number, "port", high=255)
        link = _LINK.match(link_text)
        if link is None:
            raise fail(self.source, number, f"cannot read the link state {link_text.strip()!r}")
        rate = (LinkRate.from_signalling(int(link[1]), float(link[2]))
                if link[1] is not None else None)
        self.nodes.setdefault(here, IbNode(here, kind, description, lid=lid))
        if lid:
            self.lids.setdefault(lid, here)
        item = _Port(PortRef(here, port), rate, PortState.parse(link[3]), link[4])
        self.ports.append(item)
        if (peer := _PEER.match(peer_text.strip())) is not None:
            item.peer_guid = guid(peer[1], self.source, number) if peer[1] else None
            item.peer_lid = integer(peer[2], self.source, number, "peer LID", high=0xFFFF)
            item.peer_port = integer(peer[3], self.source, number, "peer port", high=255)
            item.peer_description = peer[4].strip()
        elif _NO_PEER.match(peer_text.strip()) is None:
            raise fail(self.source, number, f"cannot read the peer {peer_text.strip()[:60]!r}")

    def _scan(self) -> IbScan:
        links: dict[tuple[PortRef, PortRef], IbLink] = {}
        idle: list[IbPortStatus] = []
        for item in self.ports:
            if item.peer_port is None:
                idle.append(IbPortStatus(item.here, item.state, item.physical))
                continue
            peer = item.peer_guid or self.lids.get(item.peer_lid or 0) or f"lid-{item.peer_lid}"
            if peer not in self.nodes:
                kind = NodeKind.SWITCH if peer in self.lids.values() else NodeKind.CA
                self.nodes[peer] = IbNode(peer, kind, item.peer_description, lid=item.peer_lid)
            link = IbLink(item.here, PortRef(peer, item.peer_port), item.rate, item.state)
            add_link(links, link)
        return IbScan(tuple(sorted(self.nodes.values(), key=lambda n: n.guid)),
                      tuple(links.values()), tuple(idle), self.source)
