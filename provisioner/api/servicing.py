"""Servicing (issue 25): start a runbook on a node; the node's firmware components with
the baseline's version beside each (from the last ``firmware_inventory`` step)."""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from provisioner.api import CONDUCTOR, NODES, actor
from provisioner.api.openapi import Route
from provisioner.api.schemas import NodeOut, Reason, node_out, parse_json, respond
from provisioner.domain import Node, Role
from provisioner.errors import NotFound
from provisioner.lifecycle.service_record import KEY
from provisioner.lifecycle.service_step import FIRMWARE_KEY, components_out
from provisioner.validation.baseline import match_firmware

PREFIX: Final = "/api/v1"


class ServiceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    runbook: str = Field(min_length=1, max_length=64)
    reason: Reason = ""


class ComponentOut(BaseModel):
    id: str
    name: str
    version: str
    baseline_version: str | None = Field(description="the profile's baseline version; null: "
                                                      "the baseline does not name it")
    conforming: bool | None


class FirmwareOut(BaseModel):
    node_id: str
    profile: str | None
    read_at: str | None = Field(description="when the last firmware_inventory step read the "
                                            "BMC; null: never")
    components: list[ComponentOut]
    missing: list[str] = Field(description="baseline Id patterns no component matched")
    servicing: dict[str, Any] | None = Field(description="facts.servicing: the last runbook, "
                                                         "its steps' results, its outcome")


async def _node(request: web.Request) -> Node:
    key = request.match_info["id"]
    if "\x00" in key or key.encode("utf-8", "replace").decode() != key:
        raise NotFound("node", key)
    return await request.app[NODES].find(key)


async def start_service(request: web.Request) -> web.Response:
    body = ServiceRequest.model_validate(parse_json(await request.read()))
    node = await _node(request)
    conductor = request.app[CONDUCTOR]
    node = await conductor.service(node.id, body.runbook, actor=actor(request),
                                   reason=body.reason)
    return respond(node_out(node, conductor.step_status(node.id)), status=202)


async def show_firmware(request: web.Request) -> web.Response:
    node = await _node(request)
    baseline = request.app[CONDUCTOR].servicing.baseline(node).firmware
    components = components_out(node.facts)
    view = match_firmware(components, baseline)
    wanted = {m.component.id: m for m in view.matches}
    raw = node.facts.get(FIRMWARE_KEY)
    record = node.facts.get(KEY)
    out = [ComponentOut(id=c.id, name=c.name, version=c.version,
                        baseline_version=wanted[c.id].wanted.version if c.id in wanted else None,
                        conforming=wanted[c.id].conforming if c.id in wanted else None)
           for c in components]
    return respond(FirmwareOut(
        node_id=node.id, profile=node.profile, components=out,
        read_at=str(raw.get("at")) if isinstance(raw, dict) and raw.get("at") else None,
        missing=[w.pattern for w in view.unmatched] if components else [],
        servicing=record if isinstance(record, dict) else None))


_ID: Final = ("id", "node id, hostname, serial or MAC address")

ROUTES: Final = (
    Route("POST", f"{PREFIX}/nodes/{{id}}/service", start_service,
          "Run a runbook ([servicing.runbooks]) on an inspected node (then deploying) or an "
          "active one (drained in Slurm and Kubernetes first, back to active through the "
          "validation gate)", Role.OPERATOR, NodeOut, status=202, body=ServiceRequest,
          path_params=(_ID,), errors=(400, 404, 409, 413, 422)),
    Route("GET", f"{PREFIX}/nodes/{{id}}/firmware", show_firmware,
          "The node's firmware components (its last firmware_inventory) with the profile's "
          "baseline version beside each", Role.VIEWER, FirmwareOut, path_params=(_ID,),
          errors=(404,)),
)
