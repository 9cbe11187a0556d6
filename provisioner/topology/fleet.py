"""Combine the fabric and the per-host GPU/HCA reports into the ``Fleet``: one ``Node`` per
host with its leaf, its switch path upward, its NVLink domain and its link health.

A host cabled to several leaves (rail-optimised DGX SuperPODs put each rail on its own leaf)
gets one *primary* leaf: the leaf holding most of its HCAs, ties to the smallest name. Its
path continues with the smallest-named parent at each tier. Hosts of one scalable unit thus
share a leaf and a path, which is what Slurm's tree, Topograph's tier labels and Slinky's
annotation need (one switch per tier).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from provisioner.topology.fabric import valid_hostname
from provisioner.topology.model import (
    Code,
    Fabric,
    Finding,
    Fleet,
    GpuReport,
    Hca,
    Health,
    LocalCa,
    Node,
    NvlinkDomain,
    NvlinkScope,
    PortState,
    nvlink_domain,
)


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
    hosts = sorted(set(fabric.hosts() if fabric else ()) | set(reports))
    nodes = []
    for host in hosts:
        node = _node(host, fabric, reports.get(host), (local_hcas or {}).get(host, ()))
        findings += _node_findings(node, fabric)
        nodes.append(node)
    return Fleet(tuple(nodes), fabric, tuple(findings))


def _node(host: str, fabric: Fabric | None, report: GpuReport | None,
          local: Sequence[LocalCa]) -> Node:
    hcas = tuple(h for h in fabric.hcas if h.hostname == host) if fabric else ()
    leaf = primary_leaf(hcas)
    path = switch_path(fabric, leaf) if fabric and leaf else ()
    nvlink = (nvlink_domain(report.gpus) if report is not None
              else NvlinkDomain(NvlinkScope.NONE, reason="no nvidia-smi report"))
    return Node(host, leaf, path, nvlink, report.gpus if report else (), hcas,
                _health(hcas, fabric, leaf, local))


def primary_leaf(hcas: Sequence[Hca]) -> str | None:
    counts = Counter(h.switch for h in hcas if h.switch)
    if not counts:
        return None
    return min(counts, key=lambda name: (-counts[name], name))


def switch_path(fabric: Fabric, leaf: str) -> tuple[str, ...]:
    """The leaf, then the smallest-named parent at each tier up to the top."""
    path = [leaf]
    switch = fabric.switch(leaf)
    while switch is not None and switch.parents and len(path) < 16:
        path.append(switch.parents[0])
        switch = fabric.switch(switch.parents[0])
    return tuple(path)


def _health(hcas: Sequence[Hca], fabric: Fabric | None, leaf: str | None,
            local: Sequence[LocalCa]) -> Health:
    ports = [p for ca in local for p in ca.ports if p.is_infiniband]
    if not hcas and not ports:
        return Health.UNKNOWN
    states = [h.state for h in hcas if h.switch] + [p.state for p in ports]
    if not states or all(s is not PortState.ACTIVE for s in states):
        return Health.DOWN
    if any(s is not PortState.ACTIVE for s in states) or any(h.switch is None for h in hcas):
        return Health.DEGRADED
    expected = fabric.expected_host_rate if fabric else None
    if expected and any(h.rate and h.rate.gbps < expected.gbps for h in hcas):
        return Health.DEGRADED
    if fabric and leaf and any(f.code is Code.UPLINKS_MISSING and f.subject == leaf
                               for f in fabric.findings):
        return Health.DEGRADED
    return Health.OK


def _node_findings(node: Node, fabric: Fabric | None) -> list[Finding]:
    findings = []
    if node.nvlink.scope in (NvlinkScope.NOT_READY, NvlinkScope.INCONSISTENT):
        findings.append(Finding(Code.NVLINK, node.hostname,
                                f"no NVLink clique: {node.nvlink.reason}"))
    if fabric is not None and node.leaf is None and node.gpus:
        findings.append(Finding(Code.NO_LEAF, node.hostname,
                                "GPU host not in the InfiniBand fabric"))
    return findings
