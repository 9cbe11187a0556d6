"""``/ui/health``: the fleet's health at a glance: the open findings (newest sighting
first), the nodes a repair ladder holds (``repairing``, ``repair_failed``) with the rung each
is on, the ``service_required`` nodes with their repair record (what an operator hands to
the vendor: serial, parts, evidence, what was tried), and the circuit breaker."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from provisioner.api import HEALTH, NODES, REPAIRS
from provisioner.api.ui import ENV
from provisioner.api.ui.auth import page
from provisioner.api.ui.render import html
from provisioner.api.ui.session import Session
from provisioner.domain import Node
from provisioner.health.record import RepairRecord
from provisioner.lifecycle.states import NodeState
from provisioner.store.findings import FindingFilter

_MAX_ROWS = 500


@dataclass(frozen=True, slots=True)
class Ladder:
    node: Node
    record: RepairRecord | None

    @property
    def name(self) -> str:
        return self.node.hostname or self.node.id

    @property
    def rung(self) -> str:
        """The rung the ladder is on (or stopped at): the first of its plan not yet
        tried; "drain" before the first; "-" when none is left."""
        if self.record is None:
            return "-"
        done = {r.rung for r in self.record.tried}
        left = [r for r in self.record.plan if r not in done]
        if not self.record.tried and self.node.state is NodeState.REPAIRING:
            return f"drain, then {left[0]}" if left else "drain"
        return left[0] if left else "-"


@page
async def health_page(request: web.Request, session: Session) -> web.Response:
    health = request.app.get(HEALTH)
    findings, total = ([], 0) if health is None else await health.repo.list(
        FindingFilter(open_only=True), limit=_MAX_ROWS)
    nodes = request.app[NODES]
    repairing = [Ladder(n, RepairRecord.from_facts(n.facts)) for n in sorted(
        await nodes.in_states([NodeState.REPAIRING, NodeState.REPAIR_FAILED]),
        key=lambda n: n.hostname or n.id)]
    stuck = [Ladder(n, RepairRecord.from_facts(n.facts)) for n in sorted(
        await nodes.in_states([NodeState.SERVICE_REQUIRED]), key=lambda n: n.hostname or n.id)]
    repairs = request.app.get(REPAIRS)
    breaker = await repairs.current_breaker() if repairs is not None else None
    return html(request.app[ENV], "health.html.j2", {
        "session": session, "wired": health is not None, "findings": findings,
        "more": max(0, total - len(findings)), "repairing": repairing, "stuck": stuck,
        "breaker": breaker})
