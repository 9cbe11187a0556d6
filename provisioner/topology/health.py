"""Link health of a fabric: down ports, degraded rates, missing uplinks, missing hosts,
error counters, and what changed against a baseline scan.

"Expected" rates are explicit or the most common rate of their class (host links between an
HCA and its leaf, switch links between switches): a link slower than that is degraded. In a
fat tree every switch of a tier has the same number of uplinks (and downlinks); a switch with
fewer than the most common count has lost a cable. An unused switch port is not a fault:
only HCA ports, links that are not Active, and links a baseline had, are.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable

from provisioner.topology.model import (
    Code,
    Fabric,
    Finding,
    IbLink,
    IbScan,
    LinkRate,
    PortErrors,
    PortRef,
    PortState,
    Severity,
    Switch,
)


def common_rates(fabric: Fabric) -> tuple[LinkRate | None, LinkRate | None]:
    """The most common (host-link, switch-link) rates; ties go to the faster rate."""
    hosts = {h.guid for h in fabric.hcas}
    switches = {s.guid for s in fabric.switches}
    host_rates: Counter[LinkRate] = Counter()
    switch_rates: Counter[LinkRate] = Counter()
    for link in fabric.links:
        if link.rate is None:
            continue
        ends = {link.a.guid, link.b.guid}
        if ends <= switches:
            switch_rates[link.rate] += 1
        elif ends & hosts and ends & switches:
            host_rates[link.rate] += 1
    return _mode(host_rates), _mode(switch_rates)


def _mode(rates: Counter[LinkRate]) -> LinkRate | None:
    if not rates:
        return None
    return max(rates.items(), key=lambda item: (item[1], item[0].gbps))[0]


def fabric_health(fabric: Fabric, scan: IbScan, known_hosts: Collection[str] | None,
                  host_rate: LinkRate | None, switch_rate: LinkRate | None) -> list[Finding]:
    findings = _link_findings(fabric, host_rate, switch_rate)
    findings += _idle_hca_ports(fabric, scan)
    findings += _balance(fabric)
    findings += _hosts(fabric, known_hosts)
    return findings


class Namer:
    """Names of a fabric's port ends: ``ib-leaf-01[5]``, ``gpu-node-01 mlx5_0[1]``,
    ``0x<guid>[port]``; built once per fabric (dictionary lookups, fleets are large)."""

    def __init__(self, fabric: Fabric) -> None:
        self._names = {h.guid: h.description for h in fabric.hcas if h.description}
        self._names.update((s.guid, s.name) for s in fabric.switches)
        self._tiers = {s.guid: s.tier or 0 for s in fabric.switches}

    def end(self, ref: PortRef) -> str:
        return f"{self._names.get(ref.guid) or '0x' + ref.guid}[{ref.port}]"

    def link(self, link: IbLink) -> str:
        """Both ends, the HCA first, then the lower tier: ``gpu-node-07 mlx5_0[1] -
        ib-leaf-02[3]``."""
        def order(ref: PortRef) -> tuple[bool, int, str]:
            return ref.guid in self._tiers, self._tiers.get(ref.guid, 0), self.end(ref)

        return " - ".join(self.end(ref) for ref in sorted((link.a, link.b), key=order))


def _link_findings(fabric: Fabric, host_rate: LinkRate | None,
                   switch_rate: LinkRate | None) -> list[Finding]:
    switches = {s.guid for s in fabric.switches}
    namer = Namer(fabric)
    findings = []
    for link in fabric.links:
        name = namer.link(link)
        if link.state is not PortState.ACTIVE:
            findings.append(Finding(Code.PORT_DOWN, name, f"link is {link.state}, not active"))
        expected = switch_rate if {link.a.guid, link.b.guid} <= switches else host_rate
        if link.rate is not None and expected is not None and link.rate.gbps < expected.gbps:
            findings.append(Finding(Code.RATE_DEGRADED, name,
                                    f"runs at {link.rate}, expected {expected}"))
    return findings


def _idle_hca_ports(fabric: Fabric, scan: IbScan) -> list[Finding]:
    hcas = {h.guid: h.description for h in fabric.hcas}
    return [Finding(Code.PORT_DOWN, f"{hcas[p.ref.guid]}[{p.ref.port}]",
                    f"HCA port {p.state}{'/' + p.physical if p.physical else ''}",
                    Severity.ERROR)
            for p in scan.idle_ports if p.ref.guid in hcas]


def _balance(fabric: Fabric) -> list[Finding]:
    """Per tier, switches with fewer uplinks (or downlinks) than most of their peers."""
    tier = {s.guid: s.tier for s in fabric.switches}
    up: Counter[str] = Counter()
    down: Counter[str] = Counter()
    for link in fabric.links:
        ta, tb = tier.get(link.a.guid), tier.get(link.b.guid)
        if ta is None or tb is None or abs(ta - tb) != 1:
            continue
        low, high = (link.a.guid, link.b.guid) if ta < tb else (link.b.guid, link.a.guid)
        up[low] += 1
        down[high] += 1
    levels = {s.tier for s in fabric.switches if s.tier is not None}
    findings = []
    for level in sorted(levels):
        peers = [s for s in fabric.switches if s.tier == level]
        if level + 1 in levels:
            findings += _short(peers, up, level, "uplinks")
        if level > 1:
            findings += _short(peers, down, level, "downlinks")
    return findings


def _short(peers: list[Switch], counts: Counter[str], level: int, what: str) -> list[Finding]:
    if len(peers) < 2:
        return []
    usual = Counter(counts[s.guid] for s in peers).most_common(1)[0][0]
    return [Finding(Code.UPLINKS_MISSING, s.name, f"{counts[s.guid]} {what}, tier-{level} "
                    f"peers have {usual}: a cable is missing or down")
            for s in peers if counts[s.guid] < usual]


def _hosts(fabric: Fabric, known_hosts: Collection[str] | None) -> list[Finding]:
    findings = []
    leaves: dict[str, set[str]] = defaultdict(set)
    for hca in fabric.hcas:
        if hca.hostname and hca.switch:
            leaves[hca.hostname].add(hca.switch)
    for host, switches in sorted(leaves.items()):
        if len(switches) > 1:
            findings.append(Finding(Code.MULTI_HOMED, host,
                                    f"cabled to {', '.join(sorted(switches))}", Severity.INFO))
    present = set(fabric.hosts())
    for host in sorted(set(known_hosts or ()) - present):
        findings.append(Finding(Code.HOST_MISSING, host, "known host not in the fabric",
                                Severity.ERROR))
    return findings


def port_error_findings(fabric: Fabric, errors: Iterable[PortErrors]) -> list[Finding]:
    """``ibqueryerrors`` records as findings, one per port (the ``ALL`` lines are sums)."""
    namer = Namer(fabric)
    return [Finding(Code.PORT_ERRORS, namer.end(PortRef(item.guid, item.port)),
                    ", ".join(f"{name}={value}" for name, value in item.counters))
            for item in errors if item.port is not None and item.counters]


def diff_fabric(baseline: Fabric, current: Fabric) -> list[Finding]:
    """Links and devices of ``baseline`` that ``current`` lacks, named (not by GUID)."""
    old, new = Namer(baseline), Namer(current)
    before = {old.link(link) for link in baseline.links}
    after = {new.link(link) for link in current.links}
    findings = [Finding(Code.LINK_MISSING, name, "link of the baseline is gone", Severity.ERROR)
                for name in sorted(before - after)]
    names_before = {s.name for s in baseline.switches} | set(baseline.hosts())
    names_after = {s.name for s in current.switches} | set(current.hosts())
    findings += [Finding(Code.NODE_MISSING, name, "device of the baseline is gone",
                         Severity.ERROR) for name in sorted(names_before - names_after)]
    return findings
