"""Fabric acceptance in the console (issue 26): each domain's last run next to the topology
(``/ui/fabric``), its figures against their floors per node with the slowest named
(``/ui/fabric/domains/<id>``), whether a Slurm maintenance reservation holds it, and the
rerun: ``POST /ui/fabric/domains/<id>/accept`` (an operator's form: same origin, CSRF; a
first POST asks to confirm, ``confirm=yes`` runs ``DomainAcceptance.rerun`` as ``provisioner
fabric accept`` does)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote, urlencode

from aiohttp import web

from provisioner.api import ACCEPTANCE, CONDUCTOR, actor
from provisioner.api.acceptance import AcceptanceOut, acceptance_out
from provisioner.api.ui import ENV
from provisioner.api.ui.auth import FormData, form, refuse
from provisioner.api.ui.render import html
from provisioner.api.ui.session import Session
from provisioner.domain import Role
from provisioner.errors import Conflict, NotFound
from provisioner.lifecycle.acceptance import DomainAcceptance
from provisioner.lifecycle.acceptance_active import RESERVATION_KEY, reservation_name
from provisioner.lifecycle.states import Event
from provisioner.store.acceptance import RUNNING, AcceptanceRun, Standing

_MAX_ID = 200


@dataclass(frozen=True, slots=True)
class AcceptanceView:
    """A domain's last run as the console shows it."""

    run: AcceptanceOut
    last_pass: datetime | None
    reservation: str | None  # the maintenance reservation the run was (or is) in
    held: bool               # that reservation holds the domain now (a failed run kept it)

    @property
    def when(self) -> datetime:
        return self.run.finished_at or self.run.started_at


def view_of(run: AcceptanceRun, last_pass: datetime | None,
            held_nodes: frozenset[str] | set[str]) -> AcceptanceView:
    kept = run.result.get(RESERVATION_KEY)
    name = kept.get("name") if isinstance(kept, Mapping) else None
    if name is None and run.status == RUNNING and "(reservation " in run.requested_by:
        name = reservation_name(run.domain)
    names = {n for _, n in run.nodes}
    return AcceptanceView(acceptance_out(run), last_pass, str(name) if name else None,
                          run.held or bool(names & set(held_nodes)))


def acceptance_of(request: web.Request) -> DomainAcceptance | None:
    return request.app.get(ACCEPTANCE)


async def views(request: web.Request) -> dict[str, AcceptanceView]:
    """Every domain that ever had a run; empty where acceptance is not wired."""
    acceptance = acceptance_of(request)
    if acceptance is None:
        return {}
    standings: dict[str, Standing] = await acceptance.standings()
    held = await acceptance.held_nodes()
    return {d: view_of(s.latest, s.last_pass, held) for d, s in standings.items()}


async def view(request: web.Request, domain: str) -> AcceptanceView | None:
    return (await views(request)).get(domain)


async def _accept(request: web.Request, session: Session,
                  data: FormData) -> web.StreamResponse:
    domain = request.match_info["clique"][:_MAX_ID]
    acceptance = acceptance_of(request)
    if acceptance is None:
        return refuse(request, 503, "fabric acceptance is not wired in this daemon")
    page = f"/ui/fabric/domains/{quote(domain, safe='')}"
    if data.get("confirm") != "yes":
        return html(request.app[ENV], "accept.html.j2", {
            "session": session, "domain": domain, "page": page,
            "last": await view(request, domain)})
    conductor, who = request.app[CONDUCTOR], actor(request)

    async def retry(node_id: str) -> object:
        return await conductor.fire(node_id, Event.RETRY, actor=who,
                                    reason=f"fabric acceptance of {domain} rerun")

    try:
        started = await acceptance.rerun(domain, retry, requested_by=who)
    except (Conflict, NotFound) as exc:
        raise web.HTTPSeeOther(f"{page}?" + urlencode(
            {"failed": f"fabric accept: {exc}"[:500]})) from None
    done = (f"acceptance of {', '.join(started.nodes)} started inside Slurm reservation "
            f"{started.reservation}" if started.reservation else
            f"retried {', '.join(started.nodes)}: the acceptance runs again once they "
            "passed their own checks")
    raise web.HTTPSeeOther(f"{page}?" + urlencode({"done": done[:500]}))


accept = form(_accept, role=Role.OPERATOR)
