"""``GET /api/v1/nodes/{id}/why``: is the node schedulable, and if not, why (the steps of
``lifecycle.schedulable``, the same the console's node page shows). ``explain_node`` reads
what the reasoning needs: the node's history, its NVLink domain's members, its open health
findings, where the published topology puts it and, for an active node, what slurmctld says
of it now (bounded by ``SLURM_TIMEOUT_S``: a slow slurmctld is reported, not waited for)."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from provisioner.api import CONDUCTOR, HEALTH, NODES, SLURM, TOPOLOGY
from provisioner.api.openapi import Route
from provisioner.api.schemas import respond
from provisioner.domain import Node, Role
from provisioner.errors import NotFound, ProvisionerError
from provisioner.health.records import FindingRecord
from provisioner.lifecycle.schedulable import Why, why
from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.why import Seen, SlurmSeen, clique_members
from provisioner.store.findings import FindingFilter
from provisioner.topology.emit import block_of

PREFIX: Final = "/api/v1"
SLURM_TIMEOUT_S: Final = 5.0
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
    seen = Seen(block=block, slurm=await _slurm(app, node), findings=findings,
                os_held=os_held)
    return why(node, history, members, seen)


async def _slurm(app: web.Application, node: Node) -> SlurmSeen | None:
    client = app.get(SLURM)
    if client is None or node.state is not NodeState.ACTIVE or not node.hostname:
        return None
    try:
        found = await asyncio.wait_for(client.node(node.hostname), SLURM_TIMEOUT_S)
    except TimeoutError:
        return SlurmSeen(None, error=f"no answer in {SLURM_TIMEOUT_S:g} s")
    except ProvisionerError as exc:
        return SlurmSeen(None, error=str(exc) or type(exc).__name__)
    if found is None:
        return SlurmSeen(None)
    return SlurmSeen(found.state_text, found.reason, found.not_registered_because(),
                     found.draining)


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
