"""``ibnetdiscover -l``/``--list``, ``ibhosts`` and ``ibswitches``: one device per line::

    Ca	 : 0x000000000010001e ports 1 devid 0x0 vendid 0x0 "gpu-node-16 mlx5_0"
    Switch	: 0x0000000000200003 ports 36 "ib-leaf-04" base port 0 lid 6 lmc 0

Devices only, no links: enough to name hosts and switches, not to place them.
"""

from __future__ import annotations

import re

from provisioner.topology.model import IbNode, IbScan, NodeKind
from provisioner.topology.parse_common import check_text, fail, guarded, guid, integer, numbered

SOURCE = "ibnetdiscover -l"
LIST_LINE = re.compile(r"^(Ca|Switch|Router|Rt)\s*:\s*0x[0-9a-fA-F]+\s+ports\s", re.IGNORECASE)
_LINE = re.compile(r'^(Ca|Switch|Router|Rt)\s*:\s*0x([0-9a-fA-F]+)\s+ports\s+(\d+)\s*(.*)$',
                   re.IGNORECASE)
_KINDS = {"ca": NodeKind.CA, "switch": NodeKind.SWITCH, "router": NodeKind.ROUTER,
          "rt": NodeKind.ROUTER}
_QUOTED = re.compile(r'"([^"]*)"(.*)$')
_LID = re.compile(r"\blid\s+(\d+)")


def parse_iblist(text: str, source: str = SOURCE) -> IbScan:
    check_text(source, text)
    return guarded(source, lambda: _parse(text, source))


def _parse(text: str, source: str) -> IbScan:
    nodes: dict[str, IbNode] = {}
    for number, line in numbered(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _LINE.match(stripped)
        if match is None:
            raise fail(source, number, f"not a device list line: {stripped[:60]!r}")
        quoted = _QUOTED.search(match[4])
        if quoted is None:
            raise fail(source, number, "no quoted node description")
        lid = _LID.search(quoted[2])
        node = IbNode(guid(match[2], source, number), _KINDS[match[1].lower()],
                      quoted[1].strip(), integer(match[3], source, number, "port count",
                                                 high=255), int(lid[1]) if lid else None)
        if node.guid in nodes:
            raise fail(source, number, f"device 0x{node.guid} listed twice")
        nodes[node.guid] = node
    if not nodes:
        raise fail(source, 0, "no devices in the input")
    return IbScan(tuple(sorted(nodes.values(), key=lambda n: n.guid)), source=source)
