"""API models of ``GET /api/v1/topology`` and their construction from the live view (the
node models live in ``schemas.py``; these are only the topology's)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from pydantic import BaseModel, Field

from provisioner.topology.emit import block_of
from provisioner.topology_live.live import LiveView


class SwitchOut(BaseModel):
    name: str
    tier: int | None = Field(description="1 = leaf (a compute HCA is cabled to it), upward")
    model: str
    hosts: list[str] = Field(description="Member hosts cabled to it (leaves)")
    children: list[str]
    parents: list[str]


class DomainOut(BaseModel):
    clique: str = Field(description="<ClusterUUID>.<CliqueId> (GFD's rule)")
    members: list[str]


class TopologyNodeOut(BaseModel):
    hostname: str
    leaf: str | None
    path: list[str] = Field(description="One switch per tier, leaf first")
    clique: str | None
    nvlink: str = Field(description="multi-node, single-node, not-ready, inconsistent, none")
    nvlink_reason: str
    health: str = Field(description="InfiniBand link health: ok, degraded, down, unknown")
    gpus: int
    block: str | None = Field(description="Its topology/block block, if in one")
    spec: str | None = Field(description="Its topology.slinky.slurm.net/spec annotation")


class IssueOut(BaseModel):
    code: str
    severity: str
    subject: str
    detail: str


class FabricOut(BaseModel):
    name: str
    sha256: str
    reporter_node_id: str | None
    received_at: datetime


class PublishOut(BaseModel):
    sink: str = Field(description="kubernetes or file")
    digest: str | None = Field(description="Digest last published completely")
    at: datetime | None
    error: str = Field(description="The last attempt's failure; empty when it succeeded")
    pending: bool = Field(description="The current digest is not (completely) published")


class OutputsOut(BaseModel):
    tree: str = Field(description="topology.conf for topology/tree")
    block: str = Field(description="topology.conf for topology/block")
    yaml: str = Field(description="topology.yaml (Slurm >= 25.05)")
    labels: dict[str, dict[str, str]] = Field(description="Topograph labels per host")
    slinky: dict[str, str] = Field(description="topology.slinky.slurm.net/spec per host")


class TopologyOut(BaseModel):
    format: str = Field(description="tree or block (topology.format)")
    digest: str = Field(description="sha256 of what is published")
    computed_at: datetime
    members: list[str] = Field(description="Hosts in the topology's member states")
    switches: list[SwitchOut]
    domains: list[DomainOut]
    nodes: list[TopologyNodeOut]
    issues: list[IssueOut]
    fabrics: list[FabricOut]
    published: list[PublishOut]
    outputs: OutputsOut


def topology_out(view: LiveView) -> TopologyOut:
    snap = view.snapshot
    fleet = snap.fleet
    blocks = block_of(snap.blocks)
    domains: dict[str, list[str]] = defaultdict(list)
    for node in fleet.nodes:
        if node.clique:
            domains[node.clique].append(node.hostname)
    switches = fleet.fabric.switches if fleet.fabric else ()
    return TopologyOut(
        format=snap.kind, digest=snap.digest, computed_at=view.computed_at,
        members=list(view.members),
        switches=[SwitchOut(name=s.name, tier=s.tier, model=s.model, hosts=list(s.hosts),
                            children=list(s.children), parents=list(s.parents))
                  for s in switches],
        domains=[DomainOut(clique=c, members=sorted(m)) for c, m in sorted(domains.items())],
        nodes=[TopologyNodeOut(hostname=n.hostname, leaf=n.leaf, path=list(n.path),
                               clique=n.clique, nvlink=str(n.nvlink.scope),
                               nvlink_reason=n.nvlink.reason, health=str(n.health),
                               gpus=len(n.gpus), block=blocks.get(n.hostname),
                               spec=snap.annotations.get(n.hostname))
               for n in fleet.nodes],
        issues=[IssueOut(code=str(f.code), severity=str(f.severity), subject=f.subject,
                         detail=f.detail) for f in snap.findings],
        fabrics=[FabricOut(name=f.name, sha256=f.sha256, reporter_node_id=f.reporter_node_id,
                           received_at=f.received_at) for f in view.fabrics],
        published=[PublishOut(sink=name, digest=s.digest, at=s.at, error=s.error,
                              pending=s.pending) for name, s in view.publishers.items()],
        outputs=OutputsOut(tree=snap.tree_conf, block=snap.block_conf,
                           yaml=snap.topology_yaml,
                           labels={h: dict(v) for h, v in snap.labels.items()},
                           slinky=dict(snap.annotations)))
