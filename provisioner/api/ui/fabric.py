"""``/ui/fabric``: NVLink domains (clique → nodes with state and validation), the InfiniBand
tree (core → spine → leaf → nodes, unhealthy links marked), Slurm blocks and the published
``topology.conf``, each domain's last fabric acceptance; ``/ui/fabric/domains/<clique>``: why
that domain is (not) schedulable and its acceptance figure by figure (``ui/acceptance.py``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web

from provisioner.api import NODES, TOPOLOGY
from provisioner.api.schemas_topology import SwitchOut, TopologyOut, topology_out
from provisioner.api.ui import DOMAINS, ENV
from provisioner.api.ui.acceptance import acceptance_of, view, views
from provisioner.api.ui.auth import page
from provisioner.api.ui.render import html
from provisioner.api.ui.session import Session
from provisioner.domain import Node, NodeSummary, Role
from provisioner.errors import NotFound
from provisioner.lifecycle.validation import member_of
from provisioner.lifecycle.why import LINKS, Chain, Status, explain
from provisioner.validation.domain import Member

_MAX_DEPTH = 6
_MAX_DOMAIN_NODES = 256


@dataclass(frozen=True, slots=True)
class DomainRow:
    hostname: str
    state: str
    maintenance: bool
    validation: str   # passed, pending, failed, unknown
    reason: str


@dataclass(frozen=True, slots=True)
class TreeNode:
    switch: SwitchOut
    children: tuple[TreeNode, ...]
    hosts: tuple[tuple[str, str], ...]   # (hostname, health)


def domains(members: Iterable[Member], topo: TopologyOut | None,
            fleet: Mapping[str, NodeSummary]) -> dict[str, list[DomainRow]]:
    """Each NVLink domain with its nodes: those whose validation record names it and
    those whose GPUs report it (not validated yet)."""
    standing: dict[str, dict[str, Member]] = defaultdict(dict)
    for member in members:
        standing[member.clique][member.name] = member
    names: dict[str, set[str]] = defaultdict(set)
    for clique, named in standing.items():
        names[clique] |= set(named)
    if topo is not None:
        for domain in topo.domains:
            names[domain.clique] |= set(domain.members)
    out: dict[str, list[DomainRow]] = {}
    for clique in sorted(names):
        rows = []
        for name in sorted(names[clique]):
            summary = fleet.get(name)
            known = standing[clique].get(name)
            rows.append(DomainRow(name, summary.state if summary else "unknown",
                                  summary.maintenance if summary else False,
                                  str(known.standing) if known else "unknown",
                                  known.reason if known else ""))
        out[clique] = rows
    return out


def tree(topo: TopologyOut) -> list[TreeNode]:
    """The switches from the top tier down; a leaf lists its hosts with their health."""
    by_name = {s.name: s for s in topo.switches}
    health = {n.hostname: n.health for n in topo.nodes}

    def build(switch: SwitchOut, depth: int, seen: frozenset[str]) -> TreeNode:
        kids = tuple(build(by_name[c], depth + 1, seen | {c}) for c in switch.children
                     if c in by_name and c not in seen and depth < _MAX_DEPTH)
        return TreeNode(switch, kids, tuple((h, health.get(h, "unknown"))
                                            for h in sorted(switch.hosts)))

    roots = [s for s in topo.switches if not any(p in by_name for p in s.parents)]
    return [build(s, 0, frozenset({s.name})) for s in sorted(roots, key=lambda s: s.name)]


def blocks(topo: TopologyOut) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = defaultdict(list)
    for node in topo.nodes:
        if node.block:
            grouped[node.block].append(node.hostname)
    return {name: sorted(hosts) for name, hosts in sorted(grouped.items())}


async def _topology(request: web.Request) -> TopologyOut | None:
    live = request.app.get(TOPOLOGY)
    return topology_out(await live.view()) if live is not None else None


@page
async def fabric_page(request: web.Request, session: Session) -> web.Response:
    topo = await _topology(request)
    fleet = {n.hostname: n for n in await request.app[NODES].summaries() if n.hostname}
    members = await request.app[DOMAINS].members()
    found = domains(members, topo, fleet)
    accepted = await views(request)
    return html(request.app[ENV], "fabric.html.j2", {
        "session": session, "topo": topo, "domains": found, "acceptance": accepted,
        "lone": {d: v for d, v in accepted.items() if d not in found},
        "accepting": acceptance_of(request) is not None,
        "tree": tree(topo) if topo else [], "blocks": blocks(topo) if topo else {},
        "unhealthy": [n for n in topo.nodes if n.health not in ("ok", "unknown")]
        if topo else [],
    })


@dataclass(frozen=True, slots=True)
class Explained:
    node: Node
    chain: Chain


@page
async def domain_page(request: web.Request, session: Session) -> web.Response:
    clique = request.match_info["clique"]
    repo = request.app[NODES]
    topo = await _topology(request)
    loaded = {n.hostname or n.id: n for n in await repo.naming_clique(clique)}
    members = [m for n in loaded.values() if (m := member_of(n)) is not None
               and m.clique == clique]
    names = {m.name for m in members}
    if topo is not None:
        names |= {h for d in topo.domains if d.clique == clique for h in d.members}
    accepted = await view(request, clique)
    if not names and accepted is not None:  # a domain of one node (its hostname)
        names = set(accepted.run.nodes)
    if not names:
        return html(request.app[ENV], "error.html.j2", {
            "session": session, "title": "Unknown NVLink domain",
            "detail": f"no node reports NVLink domain {clique[:200]}"}, status=404)
    blocks_of = {n.hostname: n.block for n in topo.nodes} if topo else {}
    explained = []
    for name in sorted(names)[:_MAX_DOMAIN_NODES]:
        node = loaded.get(name)
        if node is None:
            try:
                node = await repo.find(name)
            except NotFound:
                continue
        chain = explain(node, await repo.history(node.id), members,
                        block=blocks_of.get(name))
        explained.append(Explained(node, chain))
    first, status = domain_first([e.chain for e in explained])
    return html(request.app[ENV], "domain.html.j2", {
        "session": session, "clique": clique, "explained": explained, "links": LINKS,
        "first": first, "first_status": status, "acceptance": accepted,
        "accepting": acceptance_of(request) is not None,
        "can_act": session.role.allows(Role.OPERATOR),
        "done": request.query.get("done", "")[:500],
        "failed": request.query.get("failed", "")[:500],
    })


def domain_first(chains: Sequence[Chain]) -> tuple[str | None, Status | None]:
    """The domain's first failing link: the earliest link that fails on any member; when
    none fails, the earliest one any member still waits at."""
    for wanted in (Status.FAIL, Status.WAIT):
        found = [i for chain in chains for i, link in enumerate(chain.links)
                 if link.status is wanted]
        if found:
            return LINKS[min(found)][0], wanted
    return None, None
