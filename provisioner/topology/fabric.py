"""Build a ``Fabric`` from an ``IbScan``: name hosts and switches, find leaves, assign tiers.

Naming follows DESIGN §6 and NVIDIA Topograph (pkg/ib/ib.go): a CA's node description is
``"<hostname> <hca>"`` and the host is its first word; a switch description
``MF0;<name>:<model>/U1`` gives ``<name>``, a description without blanks, ``;`` or ``:`` is
used as is. Anything else is reported as a finding and never guessed. Leaves are switches
with a compute HCA cabled to them (SHARP "Aggregation Node" CAs do not count); tiers go
upward from the leaves, one per hop (1 = leaf, 2 = spine, 3 = core).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from provisioner.topology.health import common_rates, fabric_health
from provisioner.topology.model import (
    Code,
    Fabric,
    Finding,
    Hca,
    IbLink,
    IbNode,
    IbScan,
    LinkRate,
    NodeKind,
    PortState,
    Severity,
    Switch,
)

_HOST_DESC = re.compile(r"^(\S+)\s(\S+)$")        # Topograph's reNodeName
_SWITCH_DESC = re.compile(r"^[^;:]+;([^;:]+):([^;:]+)$")  # Topograph's reSwitchName
_HOSTNAME = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*$")
_DEVICE = re.compile(r"^(mlx\d+_\w+|HCA-\d+|ibp\w+|ib\d+|hfi\d+_\d+|irdma\d+|bnxt_re\d+|"
                     r"efa_\d+|rdmap\w+|ibsim\d+|qedr\d+|erdma_\d+)$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_DEFAULT_HOSTS = {"localhost", "localhost.localdomain", "(none)"}


@dataclass(frozen=True, slots=True)
class HostName:
    hostname: str | None
    device: str
    finding: Finding | None = None


def host_of(description: str, known_hosts: Collection[str] | None = None) -> HostName:
    """The host named by a CA description, or None and the finding saying why."""
    text = description.strip()
    match = _HOST_DESC.match(text)
    if match is None or not _DEVICE.match(match[2]) or not _HOSTNAME.match(match[1]) \
            or match[1].lower() in _DEFAULT_HOSTS:
        return HostName(None, "", Finding(
            Code.UNNAMED_HCA, text or "(empty)",
            "node description is not '<hostname> <hca>': host not guessed (set "
            "/sys/class/infiniband/<hca>/node_desc on the host)"))
    if known_hosts is not None and match[1] not in known_hosts:
        return HostName(None, match[2], Finding(
            Code.UNKNOWN_HOST, text, f"{match[1]!r} is not a known host: not placed"))
    return HostName(match[1], match[2])


def valid_hostname(name: str) -> bool:
    return bool(_HOSTNAME.match(name)) and name.lower() not in _DEFAULT_HOSTS


def switch_name(node: IbNode) -> tuple[str, str, Finding | None]:
    """(name, model, finding) for a switch; the fallback name is ``S-<guid>``."""
    text = node.description.strip()
    match = _SWITCH_DESC.match(text)
    if match is not None:
        name, model = match[1].strip(), match[2].split("/")[0].strip()
    else:
        name, model = (text if text and not re.search(r"[\s;:]", text) else ""), ""
    if name and _SLURM_NAME.match(name):
        return name, model, None
    fallback = f"S-{node.guid.removeprefix('id:')}"
    return fallback, model, Finding(Code.SWITCH_UNNAMED, fallback,
                                    f"switch description {text!r} gives no usable name")


def build_fabric(scan: IbScan, known_hosts: Collection[str] | None = None,
                 expected_host_rate: LinkRate | None = None,
                 expected_switch_rate: LinkRate | None = None) -> Fabric:
    nodes = {node.guid: node for node in scan.nodes}
    findings: list[Finding] = []
    names = _switch_names([n for n in scan.nodes if n.kind is NodeKind.SWITCH], findings)
    hcas = _hcas(scan, nodes, names, known_hosts, findings)
    tiers = _tiers(scan.links, names, {h.switch for h in hcas if h.switch}, findings)
    switches = _switches(nodes, names, tiers, hcas, scan.links)
    fabric = Fabric(switches, tuple(hcas), scan.links)
    host_mode, switch_mode = common_rates(fabric)
    host_rate, switch_rate = expected_host_rate or host_mode, expected_switch_rate or switch_mode
    findings.extend(fabric_health(fabric, scan, known_hosts, host_rate, switch_rate))
    return Fabric(switches, tuple(hcas), scan.links, tuple(findings), host_rate, switch_rate)


def _switch_names(switches: Iterable[IbNode], findings: list[Finding]) -> dict[str, str]:
    names: dict[str, str] = {}
    taken: dict[str, str] = {}
    for node in sorted(switches, key=lambda n: n.guid):
        name, _model, finding = switch_name(node)
        if finding is not None:
            findings.append(finding)
        if name in taken:
            fallback = f"S-{node.guid.removeprefix('id:')}"
            findings.append(Finding(Code.DUPLICATE_NAME, name,
                                    f"also used by 0x{taken[name]}; this one is {fallback}"))
            name = fallback
        taken[name] = node.guid
        names[node.guid] = name
    return names


def _hcas(scan: IbScan, nodes: dict[str, IbNode], names: dict[str, str],
          known_hosts: Collection[str] | None, findings: list[Finding]) -> list[Hca]:
    peers: dict[str, list[tuple[int, str | None, IbLink]]] = defaultdict(list)
    for link in scan.links:
        for here, there in ((link.a, link.b), (link.b, link.a)):
            if here.guid in nodes and nodes[here.guid].kind is NodeKind.CA:
                peers[here.guid].append((here.port, names.get(there.guid), link))
    hcas: list[Hca] = []
    for node in sorted(scan.nodes, key=lambda n: n.guid):
        if node.kind is not NodeKind.CA or "aggregation node" in node.description.lower():
            continue
        named = host_of(node.description, known_hosts)
        if named.finding is not None:
            findings.append(named.finding)
        if not peers[node.guid]:
            findings.append(Finding(Code.PORT_DOWN, node.description or f"0x{node.guid}",
                                    "HCA sees no switch (cable, switch or subnet manager "
                                    "down?)", Severity.ERROR))
            hcas.append(Hca(node.guid, node.description, named.hostname, named.device,
                            state=PortState.DOWN))
        for port, switch, link in sorted(peers[node.guid], key=lambda p: p[0]):
            hcas.append(Hca(node.guid, node.description, named.hostname, named.device, port,
                            switch, link.rate, link.state))
    return hcas


def _tiers(links: Iterable[IbLink], names: dict[str, str], leaves: set[str],
           findings: list[Finding]) -> dict[str, int | None]:
    adjacent: dict[str, set[str]] = defaultdict(set)
    for link in links:
        a, b = names.get(link.a.guid), names.get(link.b.guid)
        if a is not None and b is not None and a != b:
            adjacent[a].add(b)
            adjacent[b].add(a)
    tiers: dict[str, int | None] = dict.fromkeys(names.values())
    frontier = sorted(leaves)
    for name in frontier:
        tiers[name] = 1
    tier = 1
    while frontier:
        tier += 1
        upper = sorted({n for s in frontier for n in adjacent[s] if tiers[n] is None})
        for name in upper:
            tiers[name] = tier
        frontier = upper
    for name, value in sorted(tiers.items()):
        if value is None:
            findings.append(Finding(Code.NO_TIER, name, "no leaf below this switch: no tier",
                                    Severity.INFO))
    return tiers


def _switches(nodes: dict[str, IbNode], names: dict[str, str], tiers: dict[str, int | None],
              hcas: list[Hca], links: Iterable[IbLink]) -> tuple[Switch, ...]:
    hosts: dict[str, set[str]] = defaultdict(set)
    for hca in hcas:
        if hca.switch and hca.hostname:
            hosts[hca.switch].add(hca.hostname)
    children: dict[str, set[str]] = defaultdict(set)
    parents: dict[str, set[str]] = defaultdict(set)
    for link in links:
        a, b = names.get(link.a.guid), names.get(link.b.guid)
        ta, tb = tiers.get(a or ""), tiers.get(b or "")
        if a and b and ta is not None and tb is not None and abs(ta - tb) == 1:
            low, high = (a, b) if ta < tb else (b, a)
            children[high].add(low)
            parents[low].add(high)
    result = []
    for guid, name in names.items():
        _, model, _ = switch_name(nodes[guid])
        result.append(Switch(guid, name, nodes[guid].description, model, tiers[name],
                             tuple(sorted(hosts[name])), tuple(sorted(children[name])),
                             tuple(sorted(parents[name]))))
    return tuple(sorted(result, key=lambda s: (s.tier is None, s.tier or 0, s.name)))
