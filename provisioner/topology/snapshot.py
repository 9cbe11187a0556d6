"""The fleet topology from what the store holds, rendered once: the pure core of the live
topology (``live.py`` does the I/O).

Inputs are the fabrics' latest ``ibnetdiscover`` scans and the member hosts' ``nvidia-smi
-q -x`` reports (``read_fabric`` and ``read_gpu_report`` parse them; the caller caches).
Scans of several fabrics (rails, subnets) are merged into one graph: their GUIDs are
distinct, and a host cabled to several gets one primary leaf (fleet.py). Only member hosts
are placed (``known_hosts``): an HCA naming anyone else is a finding, never a guess.
``digest`` covers exactly what is published (topology.conf, topology.yaml, labels,
annotations), so an unchanged digest means nothing to write.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from provisioner.topology import emit
from provisioner.topology.fabric import build_fabric
from provisioner.topology.fleet import build_fleet
from provisioner.topology.model import (
    Code,
    Finding,
    Fleet,
    GpuReport,
    IbLink,
    IbNode,
    IbPortStatus,
    IbScan,
    PortRef,
    Severity,
    TopologyParseError,
)
from provisioner.topology.parse_ibnetdiscover import parse_ibnetdiscover
from provisioner.topology.parse_nvsmi_xml import parse_nvidia_smi_xml

Kind = Literal["tree", "block"]


@dataclass(frozen=True, slots=True)
class Snapshot:
    kind: Kind
    fleet: Fleet
    tree: emit.TreePlan
    blocks: emit.BlockPlan
    tree_conf: str
    block_conf: str
    topology_yaml: str
    labels: Mapping[str, Mapping[str, str]]   # {hostname: {Topograph label: value}}
    annotations: Mapping[str, str]            # {hostname: topology.slinky.slurm.net/spec}
    findings: tuple[Finding, ...]
    digest: str

    @property
    def topology_conf(self) -> str:
        """The ``topology.conf`` of the configured plugin."""
        return self.block_conf if self.kind == "block" else self.tree_conf


def build_snapshot(scans: Sequence[IbScan], hosts: Collection[str],
                   reports: Sequence[GpuReport] = (), *, kind: Kind = "tree",
                   block_size: int | None = None,
                   findings: Sequence[Finding] = ()) -> Snapshot:
    """``hosts``: the member hostnames; ``findings``: those of reading the inputs."""
    known = set(hosts)
    scan = merge_scans(scans)
    fabric = build_fabric(scan, known) if scan is not None else None
    fleet = build_fleet(fabric, reports, known)
    tree = emit.plan_tree(fleet)
    blocks = emit.plan_blocks(fleet, block_size or None)
    tree_text, block_text = emit.tree_conf(tree), emit.block_conf(blocks)
    yaml_text = emit.topology_yaml(tree, blocks, default=kind)
    labels = emit.topograph_labels(fleet)
    annotations = (emit.slinky_annotations(fleet, blocks=blocks) if kind == "block"
                   else emit.slinky_annotations(fleet, tree=tree))
    plan_findings = blocks.findings if kind == "block" else tree.findings
    conf = block_text if kind == "block" else tree_text
    return Snapshot(kind, fleet, tree, blocks, tree_text, block_text, yaml_text, labels,
                    annotations, tuple(findings) + fleet.findings + plan_findings,
                    digest_of(conf, yaml_text, labels, annotations))


def read_fabric(name: str, text: str) -> IbScan | Finding:
    """A stored scan, or the finding saying why it is left out."""
    try:
        return parse_ibnetdiscover(text, source=f"fabric {name}")
    except TopologyParseError as exc:
        return Finding(Code.UNREADABLE, f"fabric {name}", str(exc), Severity.ERROR)


def read_gpu_report(hostname: str, xml: str) -> GpuReport | Finding:
    """A node's ``nvidia-smi -q -x``, or the finding saying why it is left out."""
    try:
        return parse_nvidia_smi_xml(xml, hostname, source=f"{hostname}: nvidia-smi -q -x")
    except TopologyParseError as exc:
        return Finding(Code.UNREADABLE, hostname, str(exc), Severity.ERROR)


def digest_of(conf: str, yaml_text: str, labels: Mapping[str, Mapping[str, str]],
              annotations: Mapping[str, str]) -> str:
    published = {"topology.conf": conf, "topology.yaml": yaml_text, "labels": labels,
                 "annotations": annotations}
    return hashlib.sha256(json.dumps(published, sort_keys=True).encode()).hexdigest()


def merge_scans(scans: Collection[IbScan]) -> IbScan | None:
    """One scan of all fabrics; a device seen in several keeps its first record."""
    if not scans:
        return None
    nodes: dict[str, IbNode] = {}
    links: dict[tuple[PortRef, PortRef], IbLink] = {}
    idle: dict[PortRef, IbPortStatus] = {}
    for scan in scans:
        for node in scan.nodes:
            nodes.setdefault(node.guid, node)
        for link in scan.links:
            links.setdefault(link.key(), link)
        for port in scan.idle_ports:
            idle.setdefault(port.ref, port)
    return IbScan(tuple(nodes.values()), tuple(links.values()), tuple(idle.values()),
                  source=", ".join(scan.source for scan in scans))
