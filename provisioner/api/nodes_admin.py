"""An operator's edits of nodes (issue 30): ``PATCH`` and ``DELETE /nodes/{id}``, replace a
retired chassis, and one action on every node a filter matches (with a preview and a cap).
Parse, call the conductor, serialise."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from provisioner.api import CONDUCTOR, NODES, actor
from provisioner.api.nodes import ACTIONS, ADOPT, PREFIX, _node, apply_action
from provisioner.api.openapi import Route
from provisioner.api.schemas import NodeOut, history_out, node_out, parse_json, respond
from provisioner.api.schemas_nodes import (
    BulkActionRequest,
    BulkActionResult,
    BulkNode,
    DeletedNode,
    NodeEditRequest,
    ReplaceRequest,
    ReplaceResult,
)
from provisioner.domain import Node, NodeFilter, Role
from provisioner.errors import Conflict, InvalidRequest, ProvisionerError

#: what a bulk action may be (adopting needs one node's report: one at a time)
BULK_ACTIONS: Final = tuple(name for name in ACTIONS if name != ADOPT)


async def edit_node(request: web.Request) -> web.Response:
    body = NodeEditRequest.model_validate(parse_json(await request.read()))
    node = await _node(request)
    conductor = request.app[CONDUCTOR]
    node = await conductor.edit_node(node.id, body.changes(), actor=actor(request),
                                     reason=body.reason, force=body.force)
    return respond(node_out(node, conductor.step_status(node.id)))


async def delete_node(request: web.Request) -> web.Response:
    node = await _node(request)
    node, history = await request.app[CONDUCTOR].delete_node(node.id, actor=actor(request))
    return respond(DeletedNode(node=node_out(node, None),
                               history=[history_out(entry) for entry in history]))


async def replace_node(request: web.Request) -> web.Response:
    body = ReplaceRequest.model_validate(parse_json(await request.read()))
    old = await _node(request)
    new = await request.app[NODES].find(body.with_)
    conductor = request.app[CONDUCTOR]
    old, new = await conductor.replace_node(old.id, new.id, actor=actor(request),
                                            reason=body.reason)
    return respond(ReplaceResult(old=node_out(old, conductor.step_status(old.id)),
                                 new=node_out(new, conductor.step_status(new.id))))


async def bulk_action(request: web.Request) -> web.Response:
    body = BulkActionRequest.model_validate(parse_json(await request.read()))
    if body.action not in BULK_ACTIONS:
        raise InvalidRequest(f"unknown bulk action {body.action!r}; valid: "
                             + ", ".join(BULK_ACTIONS))
    f = body.filter
    flt = NodeFilter(state=f.state, rack=f.rack, profile=f.profile,
                     maintenance=f.maintenance, query=f.q)
    found, total = await request.app[NODES].list(flt, limit=body.max, offset=0)
    if total > body.max and not body.dry_run:
        raise Conflict(f"{total} nodes match the filter, more than max {body.max}: nothing "
                       "done (narrow the filter, or raise max after a dry run)")
    result = BulkActionResult(action=body.action, dry_run=body.dry_run, total=total,
                              max=body.max, matched=[_brief(n) for n in found], applied=[],
                              failed=[])
    if body.dry_run:
        return respond(result)
    conductor = request.app[CONDUCTOR]
    who = actor(request)
    for node in found:
        try:
            after = await apply_action(conductor, node.id, body.action, actor=who,
                                       reason=body.reason)
        except ProvisionerError as exc:
            result.failed.append(_brief(node, str(exc)))
        else:
            result.applied.append(_brief(after))
    return respond(result, status=202)


def _brief(node: Node, error: str | None = None) -> BulkNode:
    return BulkNode(id=node.id, hostname=node.hostname, state=node.state, error=error)


_ID: Final = ("id", "node id, hostname, serial or MAC address")

ROUTES: Final = (
    Route("POST", f"{PREFIX}/nodes/actions", bulk_action,
          "One action on every node a filter matches (each node's refusal in ``failed``); "
          "dry_run previews (200), max caps (409 and nothing done when more match)",
          Role.OPERATOR, BulkActionResult, status=202,
          body=BulkActionRequest, errors=(400, 409, 413, 422)),
    Route("PATCH", f"{PREFIX}/nodes/{{id}}", edit_node,
          "Edit hostname, rack, position or profile (history rows with the actor); 409 when "
          "renaming or re-profiling an active or in-flight node without force",
          Role.OPERATOR, NodeOut,
          body=NodeEditRequest, path_params=(_ID,), errors=(400, 404, 409, 413, 422)),
    Route("DELETE", f"{PREFIX}/nodes/{{id}}", delete_node,
          "Delete a retired node (409 naming its state otherwise); answers with the node and "
          "the history it had", Role.ADMIN, DeletedNode, path_params=(_ID,),
          errors=(404, 409)),
    Route("POST", f"{PREFIX}/nodes/{{id}}/replace", replace_node,
          "A new chassis takes this retired node's hostname, rack and position; both "
          "histories name the other", Role.OPERATOR, ReplaceResult, body=ReplaceRequest,
          path_params=(_ID,), errors=(400, 404, 409, 413, 422)),
)
