"""Fabric acceptance of a domain (issue 26): ``GET /api/v1/fabric/domains/{id}/acceptance``
returns its last run with each test's figure and floor per node; ``POST`` reruns a held
domain after a repair (its ``validate_failed`` nodes are retried through the conductor, are
checked anew and, once all passed, start a new run), or accepts an active domain inside a
Slurm maintenance reservation on its nodes. ``{id}``: the NVLink clique
(``<ClusterUUID>.<CliqueId>``), or the hostname of a node that names none."""

from __future__ import annotations

from datetime import datetime
from typing import Final

from aiohttp import web
from pydantic import BaseModel, Field

from provisioner.api import ACCEPTANCE, CONDUCTOR, actor
from provisioner.api.nodes import PREFIX
from provisioner.api.openapi import Route
from provisioner.api.schemas import respond
from provisioner.domain import Role
from provisioner.errors import NotFound
from provisioner.lifecycle.acceptance import DomainAcceptance
from provisioner.lifecycle.states import Event
from provisioner.store.acceptance import AcceptanceRun


class FigureOut(BaseModel):
    test: str
    figure: str
    value: str = Field(description="the measured figure with its unit, or a condition")
    floor: str = Field(description="the floor it is held to (x(1-tolerance)), or -")
    passed: bool
    reason: str


class NodeResultOut(BaseModel):
    node: str = Field(description="the node's hostname, or (domain) for a domain-wide test")
    passed: bool
    ratio: float | None = Field(description="its lowest figure over its floor")
    figures: list[FigureOut]


class ReportOut(BaseModel):
    output: str = Field(description="what the tool printed, verbatim (its first 256 KiB); "
                        "not parsed")
    valid_json: bool = Field(description="whether the whole output is one JSON document")
    bytes: int = Field(description="the output's full size")
    truncated: bool


class AcceptanceOut(BaseModel):
    id: str
    domain: str
    fabric_class: str
    status: str = Field(description="running, passed, failed or interrupted")
    summary: str
    slowest: str | None = Field(description="the node furthest below (or least above) "
                                "its floors")
    nodes: list[str]
    requested_by: str
    started_at: datetime
    deadline_at: datetime
    finished_at: datetime | None
    results: list[NodeResultOut]
    reports: dict[str, ReportOut] = Field(
        default_factory=dict, description="domain-wide outputs kept as printed: mndiag "
        "(`dcgmi mndiag --json` on GB200/GB300 NVL72, judged by its exit status only)")


class RerunOut(BaseModel):
    domain: str
    retried: list[str] = Field(description="the held nodes retried: they are checked anew, "
                               "then the domain's acceptance runs again; for an active "
                               "domain, the nodes accepted inside the reservation")
    reservation: str | None = Field(None, description="the Slurm maintenance reservation "
                                    "an active domain's acceptance runs in (released on a "
                                    "pass, kept on a failure: the domain is held)")


def acceptance_out(run: AcceptanceRun) -> AcceptanceOut:
    raw = run.result.get("nodes", [])
    results = [NodeResultOut(node=str(n.get("node", "")), passed=bool(n.get("passed")),
                             ratio=n.get("ratio"),
                             figures=[FigureOut(**f) for f in n.get("figures", [])])
               for n in raw if isinstance(n, dict)]
    kept = run.result.get("reports", {})
    reports = {name: ReportOut(**item) for name, item in
               (kept.items() if isinstance(kept, dict) else ()) if isinstance(item, dict)}
    return AcceptanceOut(id=run.id, domain=run.domain, fabric_class=run.fabric_class,
                         status=run.status, summary=run.summary, slowest=run.slowest,
                         nodes=[name for _, name in run.nodes], requested_by=run.requested_by,
                         started_at=run.started_at, deadline_at=run.deadline_at,
                         finished_at=run.finished_at, results=results, reports=reports)


def _acceptance(request: web.Request) -> DomainAcceptance:
    acceptance = request.app.get(ACCEPTANCE)
    if acceptance is None:
        raise web.HTTPServiceUnavailable(text="fabric acceptance is not wired in this daemon")
    return acceptance


async def show_acceptance(request: web.Request) -> web.Response:
    domain = request.match_info["id"]
    run = await _acceptance(request).latest(domain)
    if run is None:
        raise NotFound("fabric acceptance of domain", domain)
    return respond(acceptance_out(run))


async def start_acceptance(request: web.Request) -> web.Response:
    domain = request.match_info["id"]
    conductor, who = request.app[CONDUCTOR], actor(request)

    async def retry(node_id: str) -> object:
        return await conductor.fire(node_id, Event.RETRY, actor=who,
                                    reason=f"fabric acceptance of {domain} rerun")

    started = await _acceptance(request).rerun(domain, retry, requested_by=who)
    return respond(RerunOut(domain=domain, retried=started.nodes,
                            reservation=started.reservation), status=202)


_ID: Final = ("id", "the NVLink domain (ClusterUUID.CliqueId), or a lone node's hostname")

ROUTES: Final = (
    Route("GET", f"{PREFIX}/fabric/domains/{{id}}/acceptance", show_acceptance,
          "The domain's last fabric acceptance: its status, the slowest node, and each "
          "test's figure against its floor per node", Role.VIEWER, AcceptanceOut,
          path_params=(_ID,), errors=(404, 503)),
    Route("POST", f"{PREFIX}/fabric/domains/{{id}}/acceptance", start_acceptance,
          "Rerun a held domain's acceptance after a repair: its validate_failed nodes are "
          "retried, checked anew, and the domain's acceptance runs again once all passed; "
          "an active domain is accepted inside a Slurm maintenance reservation on exactly "
          "its nodes, released on a pass (409 while a run goes on, or for an active domain "
          "without Slurm)", Role.OPERATOR, RerunOut,
          status=202, body_required=False, path_params=(_ID,), errors=(404, 409, 503)),
)
