"""Combine the fabric and the per-host GPU/HCA reports into the ``Fleet``: one ``Node`` per
host with its leaf, its switch path upward, its NVLink domain and its link health.

A host cabled to several leaves (rail-optimised DGX SuperPODs put each rail on its own leaf)
gets one *primary* leaf: the leaf holding most of its HCAs, ties to the smallest name. Its
path continues with the smallest-named parent at each tier. Hosts of one scalable unit thus
share a leaf and a path, which is what Slurm's tree, Topograph's tier labels and Slinky's
annotation need (one switch per tier).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from provisioner.topology.fabric import valid_hostname
from provisioner.topology.model import (
    Code,
    Fabric,
    Finding,
    Fleet,
    GpuReport,
    Hca,
    Health,
    LinkRate,
    LocalCa,
    Node,
    NvlinkDomain,
    NvlinkScope,
    PortState,
    Switch,
    nvlink_domain,
)


@dataclass(frozen=True)
class _Index:
    """Lookups built once per fleet (fleets have thousands of hosts)."""

    fabric: Fabric | None
    hcas: Mapping[str, tuple[Hca, ...]]
    switches: Mapping[str, Switch]
    short_leaves: frozenset[str]       # leaves that lost an uplink

    @classmethod
    def of(cls, fabric: Fabric | None) -> _Index:
        if fabric is None:
            return cls(None, {}, {}, frozenset())
        by_host: dict[str, list[Hca]] = defaultdict(list)
        for hca in fabric.hcas:
            if hca.hostname:
                by_host[hca.hostname].append(hca)
        short = frozenset(f.subject for f in fabric.findings if f.code is Code.UPLINKS_MISSING)
        return cls(fabric, {h: tuple(v) for h, v in by_host.items()},
                   {s.name: s for s in fabric.switches}, short)


def build_fleet(fabric: Fabric | None, gpu_reports: Sequence[GpuReport] = (),
                known_hosts: Collection[str] | None = None,
                local_hcas: Mapping[str, Sequence[LocalCa]] | None = None) -> Fleet:
    findings: list[Finding] = list(fabric.findings) if fabric else []
    reports: dict[str, GpuReport] = {}
    for report in gpu_reports:
        if not valid_hostname(report.hostname):
            findings.append(Finding(Code.UNKNOWN_HOST, report.hostname or "(empty)",
                                    "GPU report names no valid hostname: left out"))
        elif known_hosts is not None and report.hostname not in known_hosts:
            findings.append(Finding(Code.UNKNOWN_HOST, report.hostname,
                                    "GPU report for a host that is not known: left out"))
        else:
            reports[report.hostname] = report
    index = _Index.of(fabric)
    nodes = []
    for host in sorted(set(index.hcas) | set(reports)):
        node = _node(host, index, reports.get(host), (local_hcas or {}).get(host, ()))
        findings += _node_findings(node, fabric)
        nodes.append(node)
    return Fleet(tuple(nodes), fabric, tuple(findings))


def _node(host: str, index: _Index, report: GpuReport | None,
          local: Sequence[LocalCa]) -> Node:
    hcas = index.hcas.get(host, ())
    leaf = primary_leaf(hcas)
    path = switch_path(index.switches, leaf) if leaf else ()
    nvlink = (nvlink_domain(report.gpus) if report is not None
              else NvlinkDomain(NvlinkScope.NONE, reason="no nvidia-smi report"))
    expected = index.fabric.expected_host_rate if index.fabric else None
    health = _health(hcas, local, expected, leaf in index.short_leaves)
    return Node(host, leaf, path, nvlink, report.gpus if report else (), hcas, health)


def primary_leaf(hcas: Sequence[Hca]) -> str | None:
    counts = Counter(h.switch for h in hcas if h.switch)
    if not counts:
        return None
    return min(counts, key=lambda name: (-counts[name], name))


def switch_path(switches: Mapping[str, Switch], leaf: str) -> tuple[str, ...]:
    """The leaf, then the smallest-named parent at each tier up to the top."""
    path = [leaf]
    switch = switches.get(leaf)
    while switch is not None and switch.parents and len(path) < 16:
        path.append(switch.parents[0])
        switch = switches.get(switch.parents[0])
    return tuple(path)


def _health(hcas: Sequence[Hca], local: Sequence[LocalCa], expected: LinkRate | None,
            leaf_short: bool) -> Health:
    ports = [p for ca in local for p in ca.ports if p.is_infiniband]
    if not hcas and not ports:
        return Health.UNKNOWN
    states = [h.state for h in hcas if h.switch] + [p.state for p in ports]
    if not states or all(s is not PortState.ACTIVE for s in states):
        return Health.DOWN
    if any(s is not PortState.ACTIVE for s in states) or any(h.switch is None for h in hcas):
        return Health.DEGRADED
    if expected and any(h.rate and h.rate.gbps < expected.gbps for h in hcas):
        return Health.DEGRADED
    return Health.DEGRADED if leaf_short else Health.OK


def _node_findings(node: Node, fabric: Fabric | None) -> list[Finding]:
    findings = []
    if node.nvlink.scope in (NvlinkScope.NOT_READY, NvlinkScope.INCONSISTENT):
        findings.append(Finding(Code.NVLINK, node.hostname,
                                f"no NVLink clique: {node.nvlink.reason}"))
    for gpu in node.gpus:  # a clique still, but slower: say so (the gate decides)
        if (degraded := gpu.health.degraded()) is not None:
            findings.append(Finding(Code.NVLINK, node.hostname,
                                    f"GPU {gpu.index} ({gpu.uuid}): NVLink {degraded}"))
    if fabric is not None and node.leaf is None and node.gpus:
        findings.append(Finding(Code.NO_LEAF, node.hostname,
                                "GPU host not in the InfiniBand fabric"))
    return findings
