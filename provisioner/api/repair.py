"""The repair ladder's operator handlers: start, stop, skip a rung, read the record; the
circuit breaker's state and reset. Operator role; every call is a history row."""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from provisioner.api import CONDUCTOR, NODES, REPAIRS, actor
from provisioner.api.openapi import Route
from provisioner.api.schemas import NodeOut, Reason, node_out, parse_json, respond
from provisioner.domain import Node, Role
from provisioner.errors import InvalidRequest, NotFound
from provisioner.health.model import Action, Finding, Source
from provisioner.health.record import KEY
from provisioner.lifecycle.repair import RepairService, known_class

PREFIX: Final = "/api/v1"


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RepairStartRequest(_Request):
    """A finding by hand: ``class`` (else the node's last repair record's), the recommended
    action to start from (``drain``: the class's first rung), the evidence, the part."""

    health_class: str | None = Field(None, alias="class", max_length=32)
    action: Action = Action.DRAIN
    evidence: str = Field("", max_length=4096)
    subject: str = Field("", max_length=128)
    reason: Reason = ""


class RepairSkipRequest(_Request):
    rung: str = Field(max_length=32)
    reason: Reason = ""


class RepairStopRequest(_Request):
    reason: Reason = ""


class RepairOut(BaseModel):
    outcome: str
    reason: str
    node: NodeOut


class RepairRecordOut(BaseModel):
    node_id: str
    state: str
    record: dict[str, Any] | None = Field(description="facts.repair: the finding, the plan, "
                                                      "the rungs tried with their results")


class BreakerOut(BaseModel):
    tripped: bool
    reason: str
    since: str
    held: list[str] = Field(description="ids of the nodes whose findings the breaker held")


class BreakerResetRequest(_Request):
    reason: Reason


def _service(request: web.Request) -> RepairService:
    service = request.app.get(REPAIRS)
    if service is None:
        raise InvalidRequest("the repair ladder is not available in this daemon")
    return service


async def _node(request: web.Request) -> Node:
    key = request.match_info["id"]
    if "\x00" in key or key.encode("utf-8", "replace").decode() != key:
        raise NotFound("node", key)
    return await request.app[NODES].find(key)


def _body(raw: bytes) -> Any:
    return parse_json(raw) if raw.strip() else {}


async def start_repair(request: web.Request) -> web.Response:
    body = RepairStartRequest.model_validate(_body(await request.read()))
    node = await _node(request)
    who = actor(request)
    finding = None
    if body.health_class is not None:
        finding = Finding(known_class(body.health_class), body.action,
                          body.evidence or f"operator {who}: {body.reason or 'repair'}",
                          Source.KERNEL_LOG, body.subject)
    decision = await _service(request).start(node.id, finding, actor=who, reason=body.reason)
    status = request.app[CONDUCTOR].step_status(node.id)
    return respond(RepairOut(outcome=decision.outcome, reason=decision.reason,
                             node=node_out(decision.node, status)), status=202)


async def stop_repair(request: web.Request) -> web.Response:
    body = RepairStopRequest.model_validate(_body(await request.read()))
    node = await _service(request).stop((await _node(request)).id, actor=actor(request),
                                        reason=body.reason)
    return respond(node_out(node, request.app[CONDUCTOR].step_status(node.id)))


async def skip_rung(request: web.Request) -> web.Response:
    body = RepairSkipRequest.model_validate(parse_json(await request.read()))
    node = await _service(request).skip((await _node(request)).id, body.rung,
                                        actor=actor(request), reason=body.reason)
    return respond(node_out(node, request.app[CONDUCTOR].step_status(node.id)))


async def show_repair(request: web.Request) -> web.Response:
    node = await _node(request)
    record = node.facts.get(KEY)
    return respond(RepairRecordOut(node_id=node.id, state=node.state,
                                   record=record if isinstance(record, dict) else None))


async def show_breaker(request: web.Request) -> web.Response:
    state = await _service(request).current_breaker()
    return respond(BreakerOut(tripped=state.tripped, reason=state.reason, since=state.since,
                              held=list(state.held)))


async def reset_breaker(request: web.Request) -> web.Response:
    body = BreakerResetRequest.model_validate(parse_json(await request.read()))
    state = await _service(request).reset_breaker(actor=actor(request), reason=body.reason)
    return respond(BreakerOut(tripped=state.tripped, reason=state.reason, since=state.since,
                              held=list(state.held)))


_ID: Final = ("id", "node id, hostname, serial or MAC address")
_ERRORS: Final = (400, 404, 409, 413, 422)

ROUTES: Final = (
    Route("POST", f"{PREFIX}/nodes/{{id}}/repair", start_repair,
          "Start the repair ladder of an active or service_required node (past the circuit "
          "breaker and the cool-down: an operator decided); no class: the last record's",
          Role.OPERATOR, RepairOut, status=202, body=RepairStartRequest, body_required=False,
          path_params=(_ID,), errors=_ERRORS),
    Route("POST", f"{PREFIX}/nodes/{{id}}/repair/stop", stop_repair,
          "Stop the ladder where it is: repair_failed, still drained (retry goes on, deploy "
          "reimages, retire retires)", Role.OPERATOR, NodeOut, body=RepairStopRequest,
          body_required=False, path_params=(_ID,), errors=_ERRORS),
    Route("POST", f"{PREFIX}/nodes/{{id}}/repair/skip", skip_rung,
          "Skip a rung of the open ladder (reset_gpu, restart_os, power_cycle, reimage), "
          "taken when the ladder reaches it", Role.OPERATOR, NodeOut, body=RepairSkipRequest,
          path_params=(_ID,), errors=_ERRORS),
    Route("GET", f"{PREFIX}/nodes/{{id}}/repair", show_repair,
          "The node's repair record: finding, evidence, serial and part, rungs tried with "
          "their results, outcome (what to hand the vendor)", Role.VIEWER, RepairRecordOut,
          path_params=(_ID,), errors=(404,)),
    Route("GET", f"{PREFIX}/health/breaker", show_breaker,
          "The repair circuit breaker: open or not, why, the nodes it held", Role.VIEWER,
          BreakerOut),
    Route("POST", f"{PREFIX}/health/breaker/reset", reset_breaker,
          "Close the repair circuit breaker: automatic ladders may start again",
          Role.OPERATOR, BreakerOut, body=BreakerResetRequest, errors=(400, 422)),
)
