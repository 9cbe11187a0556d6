"""Node handlers: parse, call the conductor or the repo, serialise. Nothing else happens here.

``{id}`` in a path is a node id, hostname, serial or MAC address.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from aiohttp import web

from provisioner.api import CONDUCTOR, NODES, PROFILES, SETTINGS, actor
from provisioner.api.openapi import Route
from provisioner.api.schemas import (
    ActionRequest,
    EnrollRequest,
    HistoryPage,
    NodeDetailOut,
    NodeListQuery,
    NodeOut,
    NodePage,
    history_out,
    node_detail,
    node_out,
    parse_json,
    respond,
)
from provisioner.api.schemas_nodes import NodeFactsPage, node_with_facts
from provisioner.config.profiles import ProfileRegistry
from provisioner.domain import BmcEndpoint, NewNode, Node, NodeFilter, Role
from provisioner.errors import Conflict, InvalidRequest, NotFound
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.states import Event, NodeState
from provisioner.validation.existing_os import held_for_existing_os
from provisioner.validation.sku import held_reasons

PREFIX: Final = "/api/v1"
#: list filters that may repeat (``?state=a&state=b``: either)
MULTI: Final = frozenset({"state", "rack", "profile"})

#: action name -> lifecycle event
EVENT_ACTIONS: Final[Mapping[str, Event]] = {
    "inspect": Event.INSPECT,
    "deploy": Event.DEPLOY,
    "retire": Event.RETIRE,
    "retry": Event.RETRY,
    "abort": Event.ABORT,
    # brownfield adoption (Ironic's ``adopt``): the machine already runs its OS; not
    # ``adopt``, which folds a discovered node into an enrolled one (below)
    "register-running": Event.REGISTER_RUNNING,
}
#: action name -> maintenance flag
MAINTENANCE_ACTIONS: Final[Mapping[str, bool]] = {"maintenance-on": True,
                                                  "maintenance-off": False}
#: the SKU gate's per-node override (needs a reason): a node held in ``inspected`` goes on
SKU_OVERRIDE: Final = "sku-override"
#: fold a discovered node into the node whose serial its agent reported (security: a report
#: alone never adopts a node past inspection, docs/security.md)
ADOPT: Final = "adopt"
#: deploy over the OS or data that inspection found on the node's disks (needs a reason)
ALLOW_OVERWRITE: Final = "allow-overwrite"
ACTIONS: Final = (*EVENT_ACTIONS, *MAINTENANCE_ACTIONS, SKU_OVERRIDE, ADOPT, ALLOW_OVERWRITE)


async def list_nodes(request: web.Request) -> web.Response:
    context = {"page_size_max": request.app[SETTINGS].page_size_max}
    query = NodeListQuery.model_validate(query_params(request, MULTI), context=context)
    flt = NodeFilter(state=query.state, rack=query.rack, profile=query.profile,
                     maintenance=query.maintenance, query=query.q)
    found, total = await request.app[NODES].list(flt, limit=query.limit, offset=query.offset)
    status = request.app[CONDUCTOR].step_status
    if query.include == "facts":  # one request per page for the inventory, not one per node
        return respond(NodeFactsPage(items=[node_with_facts(node, status(node.id))
                                            for node in found],
                                     total=total, limit=query.limit, offset=query.offset))
    items = [node_out(node, status(node.id)) for node in found]
    return respond(NodePage(items=items, total=total, limit=query.limit, offset=query.offset))


def query_params(request: web.Request, multi: frozenset[str]) -> dict[str, object]:
    """The query as a dict: every value of a ``multi`` parameter, else the only one (a
    repeated single-valued parameter is a 422, never silently its first value)."""
    params: dict[str, object] = {}
    for key in request.query:
        values = request.query.getall(key)
        if key in multi:
            params[key] = values
        elif len(values) > 1:
            raise InvalidRequest(f"query parameter {key!r} given {len(values)} times; "
                                 "it takes one value")
        else:
            params[key] = values[0]
    return params


async def show_node(request: web.Request) -> web.Response:
    node = await _node(request)
    history = await request.app[NODES].history(node.id)
    status = request.app[CONDUCTOR].step_status(node.id)
    return respond(node_detail(node, status, history, allowed_actions(node)))


async def node_history(request: web.Request) -> web.Response:
    node = await _node(request)
    history = await request.app[NODES].history(node.id)
    return respond(HistoryPage(items=[history_out(entry) for entry in history]))


async def enroll_node(request: web.Request) -> web.Response:
    body = EnrollRequest.model_validate(parse_json(await request.read()))
    (request.app.get(PROFILES) or ProfileRegistry()).check(body.profile)
    conductor = request.app[CONDUCTOR]
    node = await conductor.enroll(_new_node(body), actor=actor(request))
    location = f"{PREFIX}/nodes/{node.id}"
    return respond(node_out(node, conductor.step_status(node.id)), status=201,
                   headers={"Location": location})


async def act_on_node(request: web.Request) -> web.Response:
    action = request.match_info["action"]
    if action not in ACTIONS:
        raise web.HTTPNotFound(text=f"unknown action {action!r}; valid actions: "
                                    + ", ".join(ACTIONS))
    raw = await request.read()
    body = ActionRequest.model_validate(parse_json(raw)) if raw.strip() else ActionRequest()
    node = await _node(request)
    conductor = request.app[CONDUCTOR]
    if action == ADOPT:
        node = await _confirm_adoption(request, node)
        return respond(node_out(node, conductor.step_status(node.id)), status=202)
    if action == "deploy" and not body.confirm:
        refuse_unconfirmed_reimage(node)
    node = await apply_action(conductor, node.id, action, actor=actor(request),
                              reason=body.reason)
    return respond(node_out(node, conductor.step_status(node.id)), status=202)


async def apply_action(conductor: Conductor, node_id: str, action: str, *, actor: str,
                       reason: str) -> Node:
    """One named action (the REST API's and the console's one code path)."""
    if action in MAINTENANCE_ACTIONS:
        on = MAINTENANCE_ACTIONS[action]
        if on and not reason:
            raise InvalidRequest("maintenance-on needs a reason (body: {\"reason\": \"...\"})")
        return await conductor.set_maintenance(node_id, on, actor=actor, reason=reason,
                                               renew=True)
    if action == SKU_OVERRIDE:
        if not reason:
            raise InvalidRequest("sku-override needs a reason (body: {\"reason\": \"...\"})")
        return await conductor.override_sku(node_id, actor=actor, reason=reason)
    if action == ALLOW_OVERWRITE:
        if not reason:
            raise InvalidRequest("allow-overwrite needs a reason (body: {\"reason\": \"...\"})")
        return await conductor.allow_overwrite(node_id, actor=actor, reason=reason)
    return await conductor.fire(node_id, EVENT_ACTIONS[action], actor=actor, reason=reason)


def refuse_unconfirmed_reimage(node: Node) -> None:
    """Deploy of an active node re-images it: 409 naming what would be lost, unless the
    request confirms (``{"confirm": true}``, ``--yes``)."""
    if node.state is not NodeState.ACTIVE:
        return
    name = node.hostname or node.id
    raise Conflict(f"node {name} is active: deploy re-images it, erasing its disks (the "
                   "running OS and every local file) and taking it out of Slurm and "
                   "Kubernetes while it installs; confirm with {\"confirm\": true} "
                   "(provisioner node action ... deploy --yes)")


async def _confirm_adoption(request: web.Request, node: Node) -> Node:
    """An operator confirms what an agent report claimed: the discovered ``node`` is the
    machine with the serial it reported (kept in its ``last_report``)."""
    report = node.facts.get("last_report")
    system = report.get("system") if isinstance(report, dict) else None
    serial = system.get("serial") if isinstance(system, dict) else None
    if node.serial is not None or not isinstance(serial, str) or not serial:
        raise InvalidRequest(f"node {node.id}: no reported serial waiting for adoption")
    owner = await request.app[NODES].find_by_serial(serial)
    if owner is None:
        raise NotFound("node with serial", serial)
    return await request.app[CONDUCTOR].adopt(node.id, owner.id, actor=actor(request))


async def _node(request: web.Request) -> Node:
    key = request.match_info["id"]
    if "\x00" in key or key.encode("utf-8", "replace").decode() != key:
        raise NotFound("node", key)  # NUL or a lone surrogate: no node has such a name
    return await request.app[NODES].find(key)


def allowed_actions(node: Node) -> list[str]:
    """The actions that would be accepted now (what the UI offers)."""
    events = Conductor.allowed_events(node)
    names = [name for name, event in EVENT_ACTIONS.items() if event in events]
    names.append("maintenance-off" if node.maintenance else "maintenance-on")
    if node.state is NodeState.INSPECTED and held_reasons(node.facts):
        names = [name for name in names if name != "deploy"] + [SKU_OVERRIDE]
    if node.state is NodeState.INSPECTED and held_for_existing_os(node.facts, node.profile, ()):
        names = [name for name in names if name != "deploy"] + [ALLOW_OVERWRITE]
    return names


def _new_node(body: EnrollRequest) -> NewNode:
    bmc = password = None
    if body.bmc is not None:
        bmc = BmcEndpoint(driver=body.bmc.driver, address=body.bmc.address, port=body.bmc.port,
                          username=body.bmc.username)
        password = body.bmc.password.get_secret_value() if body.bmc.password else None
    return NewNode(state=NodeState.ENROLLED, hostname=body.hostname, serial=body.serial,
                   macs=tuple(body.macs), profile=body.profile, rack=body.rack,
                   position=body.position, bmc=bmc, bmc_password=password)


_ID: Final = ("id", "node id, hostname, serial or MAC address")
_ACTION: Final = ("action", "one of: " + ", ".join(ACTIONS))

ROUTES: Final = (
    Route("GET", f"{PREFIX}/nodes", list_nodes, "List nodes, filtered and paginated",
          Role.VIEWER, NodePage, query=NodeListQuery, errors=(422,)),
    Route("POST", f"{PREFIX}/nodes", enroll_node, "Enrol a machine", Role.OPERATOR, NodeOut,
          status=201, body=EnrollRequest, errors=(400, 409, 413, 422)),
    Route("GET", f"{PREFIX}/nodes/{{id}}", show_node,
          "A node with its facts, BMC endpoint (no secrets), step status and history",
          Role.VIEWER, NodeDetailOut, path_params=(_ID,), errors=(404,)),
    Route("GET", f"{PREFIX}/nodes/{{id}}/history", node_history,
          "A node's transitions, oldest first", Role.VIEWER, HistoryPage, path_params=(_ID,),
          errors=(404,)),
    Route("POST", f"{PREFIX}/nodes/{{id}}/actions/{{action}}", act_on_node,
          "Request an action; 409 names the node's state and the events it allows",
          Role.OPERATOR, NodeOut, status=202, body=ActionRequest, body_required=False,
          path_params=(_ID, _ACTION), errors=(400, 404, 409, 413, 422)),
)
