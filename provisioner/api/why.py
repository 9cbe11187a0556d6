"""``GET /api/v1/nodes/{id}/why``: is the node schedulable, and if not, why (the steps of
``lifecycle.schedulable``, the same the console's node page shows). ``explain_node`` reads
what the reasoning needs: the node's history, its NVLink domain's members, its open health
findings, where the published topology puts it and, for an active node, what slurmctld says
of it now and what the API server says of its Node (Ready, cordoned, its labels): each bounded
by a timeout (a slow slurmctld or API server is reported, not waited for)."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from provisioner.api import CONDUCTOR, HEALTH, KUBE, NODES, SLURM, TOPOLOGY
from provisioner.api.openapi import Route
from provisioner.api.schemas import respond
from provisioner.domain import Node, Role
from provisioner.errors import NotFound, ProvisionerError
from provisioner.health.records import FindingRecord
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.kube.model import ANNOTATION_CORDON
from provisioner.lifecycle.schedulable import Why, why
from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.why import KubeSeen, Seen, SlurmSeen, clique_members, rank
from provisioner.slurm.model import SlurmClient
from provisioner.store.findings import FindingFilter
from provisioner.topology.emit import block_of

PREFIX: Final = "/api/v1"
SLURM_TIMEOUT_S: Final = 5.0
KUBE_TIMEOUT_S: Final = 5.0
_MAX_FINDINGS: Final = 200


class StepOut(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str = Field(description="state, maintenance, gates, health, bmc, power, boot, "
                                 "callback, kube, gpu, validation, domain or slurm")
    title: str
    status: str = Field(description="ok, wait, fail or unknown")
    blocking: bool = Field(description="true: this step keeps the node from being scheduled")
    evidence: str
    todo: str = Field(description="what to do, for a step that blocks")


class WhyOut(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    hostname: str | None
    state: str
    schedulable: bool
    first_blocking: str | None = Field(description="the first failing (else waiting) step")
    steps: list[StepOut]


async def explain_node(app: web.Application, node: Node) -> Why:
    repo = app[NODES]
    history = await repo.history(node.id)
    members = await clique_members(repo, node)
    findings: list[FindingRecord] = []
    if (health := app.get(HEALTH)) is not None:
        findings, _ = await health.repo.list(FindingFilter(node_id=node.id, open_only=True),
                                             limit=_MAX_FINDINGS)
    block = None
    if (live := app.get(TOPOLOGY)) is not None and node.hostname:
        snapshot = (await live.view()).snapshot
        block = block_of(snapshot.blocks).get(node.hostname) or snapshot.annotations.get(
            node.hostname)
    os_held = app[CONDUCTOR].os_held(node) if node.state is NodeState.INSPECTED else ()
    slurm, kube = await asyncio.gather(_slurm(app, node), _kube(app, node))
    seen = Seen(block=block, slurm=slurm, kube=kube, findings=findings, os_held=os_held)
    return why(node, history, members, seen)


async def _slurm(app: web.Application, node: Node) -> SlurmSeen | None:
    client = app.get(SLURM)
    if client is None or node.state is not NodeState.ACTIVE or not node.hostname:
        return None
    return await read_slurm(client, node.hostname)


async def read_slurm(client: SlurmClient, name: str) -> SlurmSeen:
    """What slurmctld says of node ``name`` now: its state, reason, whether it is
    registered and drained."""
    try:
        found = await asyncio.wait_for(client.node(name), SLURM_TIMEOUT_S)
    except TimeoutError:
        return SlurmSeen(None, error=f"no answer in {SLURM_TIMEOUT_S:g} s")
    except ProvisionerError as exc:
        return SlurmSeen(None, error=str(exc) or type(exc).__name__)
    if found is None:
        return SlurmSeen(None)
    return SlurmSeen(found.state_text, found.reason, found.not_registered_because(),
                     found.draining)


async def _kube(app: web.Application, node: Node) -> KubeSeen | None:
    joiner = app.get(KUBE)
    if joiner is None or rank(node.state) < 3 or not node.hostname:  # not joined yet
        return None
    return await read_kube(joiner, node)


async def read_kube(joiner: KubeNodeJoiner, node: Node) -> KubeSeen:
    """The node's Node: registered, Ready, cordoned (by whom), the labels it lacks."""
    try:
        found, labels = await asyncio.wait_for(joiner.observe(node), KUBE_TIMEOUT_S)
    except TimeoutError:
        return KubeSeen(False, error=f"no answer in {KUBE_TIMEOUT_S:g} s")
    except ProvisionerError as exc:
        return KubeSeen(False, error=str(exc) or type(exc).__name__)
    if found is None:
        return KubeSeen(False)
    missing = tuple(f"{key}={value}" for key, value in sorted(labels.items())
                    if found.labels.get(key) != value)
    cordoned = None
    if found.unschedulable:
        cordoned = found.annotations.get(ANNOTATION_CORDON) or "by someone else"
    return KubeSeen(True, found.ready, cordoned, missing)


async def node_why(request: web.Request) -> web.Response:
    key = request.match_info["id"]
    if "\x00" in key or key.encode("utf-8", "replace").decode() != key:
        raise NotFound("node", key)
    node = await request.app[NODES].find(key)
    answer: dict[str, Any] = (await explain_node(request.app, node)).as_json()
    return respond(WhyOut.model_validate(answer))


ROUTES: Final = (
    Route("GET", f"{PREFIX}/nodes/{{id}}/why", node_why,
          "Whether the node is schedulable, and every step that keeps it from being so",
          Role.VIEWER, WhyOut, path_params=(("id", "node id, hostname, serial or MAC address"),),
          errors=(404,)),
)
