"""``ibnetdiscover -p``/``--ports``: one line per port, connected or not::

    CA 22 1 0x000000000010001f 4x HDR - SW 6 4 0x0000000000200003 ( 'gpu-node-16 mlx5_0' - 'leaf4' )
    SW  6 36 0x0000000000200003 4x SDR                         'leaf4'
    SW 52 37 0x506b4b03005c2740 4x ???                         'ib-i4l1s01'

The GUID column is the port GUID (for a switch, port 0's GUID is the node GUID), so a CA is
identified by its port GUID in this form. Links appear once from each end; they are merged.
"""

from __future__ import annotations

import re

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

SOURCE = "ibnetdiscover -p"
PORTS_LINE = re.compile(r"^(CA|SW|RT)\s+\d+\s+\d+\s+0x[0-9a-fA-F]+\s")
_KINDS = {"CA": NodeKind.CA, "SW": NodeKind.SWITCH, "RT": NodeKind.ROUTER}
_LOCAL = re.compile(r"^(CA|SW|RT)\s+(\d+)\s+(\d+)\s+0x([0-9a-fA-F]+)\s+(\d+)x\s+(\S+)\s*(.*)$")
_PEER = re.compile(r"^-\s+(CA|SW|RT)\s+(\d+)\s+(\d+)\s+0x([0-9a-fA-F]+)\s+"
                   r"\(\s*'(.*)'\s+-\s+'(.*)'\s*\)$")
_ALONE = re.compile(r"^'(.*)'$")


def parse_ibnetdiscover_ports(text: str, source: str = SOURCE) -> IbScan:
    check_text(source, text)
    return guarded(source, lambda: _parse(text, source))


def _parse(text: str, source: str) -> IbScan:
    nodes: dict[str, IbNode] = {}
    links: dict[tuple[PortRef, PortRef], IbLink] = {}
    idle: dict[PortRef, IbPortStatus] = {}
    for number, line in numbered(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        local = _LOCAL.match(stripped)
        if local is None:
            raise fail(source, number, f"not an ibnetdiscover -p line: {stripped[:60]!r}")
        lid = integer(local[2], source, number, "LID", high=0xFFFF)
        port = integer(local[3], source, number, "port", high=255)
        here = guid(local[4], source, number)
        rate = LinkRate.from_token(f"{local[5]}x{local[6]}")
        rest = local[7].strip()
        if (alone := _ALONE.match(rest)) is not None:
            _add(nodes, IbNode(here, _KINDS[local[1]], alone[1].strip(), lid=lid))
            idle.setdefault(PortRef(here, port), IbPortStatus(PortRef(here, port), PortState.DOWN))
            continue
        peer = _PEER.match(rest)
        if peer is None:
            raise fail(source, number, f"cannot read the peer of port {port}: {rest[:60]!r}")
        there = guid(peer[4], source, number)
        _add(nodes, IbNode(here, _KINDS[local[1]], peer[5].strip(), lid=lid))
        _add(nodes, IbNode(there, _KINDS[peer[1]], peer[6].strip(),
                           lid=integer(peer[2], source, number, "LID", high=0xFFFF)))
        far = PortRef(there, integer(peer[3], source, number, "port", high=255))
        link = IbLink(PortRef(here, port), far, rate)
        add_link(links, link)
    if not nodes:
        raise fail(source, 0, "no port lines in the input")
    connected = {end for link in links.values() for end in (link.a, link.b)}
    ports = tuple(s for ref, s in sorted(idle.items()) if ref not in connected)
    return IbScan(tuple(sorted(nodes.values(), key=lambda n: n.guid)), tuple(links.values()),
                  ports, source)


def _add(nodes: dict[str, IbNode], node: IbNode) -> None:
    known = nodes.get(node.guid)
    if known is None or (not known.description and node.description):
        nodes[node.guid] = node
