"""Health findings over the API: intake from outside tools and Prometheus Alertmanager,
a node's findings, the fleet's, and silences (issue 24; ``lifecycle/health.py`` does the
work). Intake and silences need the operator role, reads the viewer role.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from aiohttp import web

from provisioner.api import HEALTH, NODES, actor
from provisioner.api.openapi import Route
from provisioner.api.schemas import parse_json, respond
from provisioner.api.schemas_health import (
    AlertmanagerResult,
    FindingPage,
    FindingQuery,
    FindingsRequest,
    NodeHealthQuery,
    ReportOut,
    ReportResult,
    SilenceRequest,
    SilenceResult,
    finding_out,
)
from provisioner.domain import Node, Role
from provisioner.errors import NotFound
from provisioner.health.alertmanager import parse_webhook
from provisioner.health.records import Origin, Report
from provisioner.lifecycle.health import HealthFindings
from provisioner.store.findings import FindingFilter

PREFIX: Final = "/api/v1"


def _health(request: web.Request) -> HealthFindings:
    health = request.app.get(HEALTH)
    if health is None:
        raise web.HTTPServiceUnavailable(text="health findings are not available here")
    return health


async def _node(request: web.Request, key: str) -> Node:
    if "\x00" in key or key.encode("utf-8", "replace").decode() != key:
        raise NotFound("node", key)
    return await request.app[NODES].find(key)


async def _node_named(request: web.Request, name: str) -> Node | None:
    """An alert's node: by hostname (case-insensitive), else by its first label (an FQDN
    of a node enrolled by its short name)."""
    for key in dict.fromkeys((name, name.lower(), name.lower().split(".")[0])):
        try:
            return await _node(request, key)
        except NotFound:
            continue
    return None


async def post_findings(request: web.Request) -> web.Response:
    body = FindingsRequest.model_validate(parse_json(await request.read()))
    health, who = _health(request), actor(request)
    node = await _node(request, body.node)
    origin = Origin(body.origin)
    outcomes = []
    for item in body.findings:
        if item.resolved:
            if (done := await health.resolve(node.id, origin, item.cls, item.subject,
                                             actor=who)) is not None:
                outcomes.append(done)
        else:
            outcomes += await health.report(node.id, origin, [Report(
                item.cls, item.action, item.evidence, item.subject)], actor=who)
    now = datetime.now(UTC)
    results = [ReportOut(change=str(o.change), finding=finding_out(o.record, now, node.hostname))
               for o in outcomes]
    return respond(ReportResult(node_id=node.id, results=results))


async def post_alertmanager(request: web.Request) -> web.Response:
    payload = parse_json(await request.read())
    health, who = _health(request), f"{actor(request)}/alertmanager"
    alerts = parse_webhook(payload)
    received = len(payload.get("alerts", [])) if isinstance(payload, dict) else 0
    unknown: set[str] = set()
    firing = resolved = 0
    for alert in alerts:
        node = await _node_named(request, alert.node)
        if node is None:
            unknown.add(alert.node)
            continue
        if alert.firing:
            await health.report(node.id, Origin.ALERTMANAGER, [alert.report], actor=who)
            firing += 1
        else:
            await health.resolve(node.id, Origin.ALERTMANAGER, alert.report.cls,
                                 alert.report.subject, actor=who)
            resolved += 1
    return respond(AlertmanagerResult(received=received, firing=firing, resolved=resolved,
                                      unknown_nodes=sorted(unknown),
                                      skipped=received - len(alerts)))


async def node_health(request: web.Request) -> web.Response:
    query = NodeHealthQuery.model_validate(dict(request.query))
    node = await _node(request, request.match_info["id"])
    found, total = await _health(request).repo.list(
        FindingFilter(node_id=node.id, open_only=not query.all), limit=1000)
    now = datetime.now(UTC)
    return respond(FindingPage(items=[finding_out(r, now) for r in found], total=total))


async def list_findings(request: web.Request) -> web.Response:
    query = FindingQuery.model_validate(dict(request.query))
    node_id = (await _node(request, query.node)).id if query.node else None
    found, total = await _health(request).repo.list(
        FindingFilter(node_id=node_id, cls=query.cls, origin=query.origin,
                      open_only=not query.all), limit=query.limit, offset=query.offset)
    now = datetime.now(UTC)
    return respond(FindingPage(items=[finding_out(r, now) for r in found], total=total))


async def silence_findings(request: web.Request) -> web.Response:
    body = SilenceRequest.model_validate(parse_json(await request.read()))
    node = await _node(request, request.match_info["id"])
    records = await _health(request).silence(
        node.id, body.duration_s, reason=body.reason, actor=actor(request), cls=body.cls,
        finding_id=body.finding_id)
    now = datetime.now(UTC)
    until = records[0].silenced_until if records and records[0].silenced_until else now
    return respond(SilenceResult(silenced_until=until,
                                 items=[finding_out(r, now, node.hostname) for r in records]))


_ID: Final = ("id", "node id, hostname, serial or MAC address")

ROUTES: Final = (
    Route("POST", f"{PREFIX}/health/findings", post_findings,
          "Report health findings of one node from an outside tool (or clear them: "
          "resolved); a repeat updates the finding's last_seen, never a new one",
          Role.OPERATOR, ReportResult, body=FindingsRequest, errors=(400, 404, 413, 422)),
    Route("POST", f"{PREFIX}/health/alertmanager", post_alertmanager,
          "Prometheus Alertmanager's webhook (version 4): firing alerts become findings of "
          "the node their node/instance/Hostname label names, resolved ones clear them",
          Role.OPERATOR, AlertmanagerResult, errors=(400, 413, 422)),
    Route("GET", f"{PREFIX}/health/findings", list_findings,
          "Findings of the fleet, newest sighting first; open ones unless all=true",
          Role.VIEWER, FindingPage, query=FindingQuery, errors=(404, 422)),
    Route("GET", f"{PREFIX}/nodes/{{id}}/health", node_health,
          "A node's health findings; open ones unless all=true", Role.VIEWER, FindingPage,
          query=NodeHealthQuery, path_params=(_ID,), errors=(404, 422)),
    Route("POST", f"{PREFIX}/nodes/{{id}}/health/silence", silence_findings,
          "Silence a finding or a class of findings on a node for a time, with a reason "
          "(in the node's history); silenced findings stay listed and start no repair",
          Role.OPERATOR, SilenceResult, body=SilenceRequest, path_params=(_ID,),
          errors=(400, 404, 413, 422)),
)
