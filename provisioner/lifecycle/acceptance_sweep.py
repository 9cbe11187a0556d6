"""Fabric acceptance of active domains on a schedule (issue 26), and the hook the repair
ladder asks a domain's acceptance through.

``ReacceptSweep`` runs on the one daemon leading the ``fleet`` singleton (docs/ha.md): every
``validation.reaccept_sweep_interval_s`` it re-accepts the active domains whose last pass is
older than their profile's ``acceptance.reaccept_interval_days`` (0: off), through the same
path as ``provisioner fabric accept`` (``DomainAcceptance.rerun``: a Slurm maintenance
reservation on exactly the domain's nodes, released on a pass, kept on a failure). Never:

* more than ``validation.reaccept_max_concurrent`` active domains under a run at once,
  fleet-wide (the store's ``running`` rows, whoever started them, count);
* a domain under a run, or held (its last run failed and kept its reservation: an operator
  repairs it and runs ``fabric accept``), or with a node not ``active`` or in maintenance;
* a domain whose last scheduled try was interrupted (its jobs did not end, Slurm refused)
  less than ``validation.reaccept_retry_s`` ago.

The oldest pass goes first (never passed: first of all).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from provisioner.config import ValidationSettings
from provisioner.domain import Node
from provisioner.errors import Conflict, NotFound
from provisioner.lifecycle.acceptance import GRACE_S, DomainAcceptance, Rerun
from provisioner.lifecycle.periodic import every
from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.validation import DOMAIN_STATES, member_of
from provisioner.store.acceptance import INTERRUPTED, PASSED, RUNNING, AcceptanceRepo, Standing
from provisioner.store.repo import NodeRepo

log = logging.getLogger(__name__)
SWEEP_ACTOR: Final = "reaccept-sweep"


@dataclass(frozen=True, slots=True)
class Due:
    domain: str
    last_pass: datetime | None


@dataclass(frozen=True, slots=True)
class Asked:
    """What ``ask_acceptance`` did: started (the run's nodes and reservation) or why not."""

    domain: str
    started: Rerun | None
    reason: str = ""


def domain_of(node: Node) -> str:
    """The acceptance domain of a node: its NVLink clique, else its hostname (or id)."""
    member = member_of(node)
    return member.clique if member is not None else (node.hostname or node.id)


async def ask_acceptance(acceptance: DomainAcceptance, node: Node, *,
                         requested_by: str) -> Asked:
    """The repair ladder's hook: ask for the acceptance of ``node``'s domain (an active
    domain inside a Slurm maintenance reservation, a held one rerun). A run already going
    on, a domain not ready for one or a daemon without Slurm is an answer, not an error."""
    domain = domain_of(node)
    try:
        started = await acceptance.rerun(domain, _never_retry, requested_by=requested_by)
    except (Conflict, NotFound) as exc:
        return Asked(domain, None, str(exc))
    return Asked(domain, started)


async def _never_retry(node_id: str) -> object:
    raise Conflict(f"node {node_id} left active while its domain's acceptance was asked for")


class ReacceptSweep:
    def __init__(self, acceptance: DomainAcceptance, repo: NodeRepo, runs: AcceptanceRepo,
                 settings: ValidationSettings, *,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._acceptance = acceptance
        self._repo = repo
        self._runs = runs
        self._settings = settings
        self._clock = clock
        self.interval_s = settings.reaccept_sweep_interval_s

    @property
    def enabled(self) -> bool:
        return any(p.acceptance is not None and p.acceptance.reaccept_interval_days > 0
                   for p in self._settings.profiles.values())

    def _interval(self, node: Node) -> timedelta | None:
        profile = self._settings.profiles.get(node.profile or "")
        days = profile.acceptance.reaccept_interval_days if (
            profile is not None and profile.acceptance is not None) else 0.0
        return timedelta(days=days) if days > 0 else None

    async def _domains(self, standings: dict[str, Standing]) -> dict[str, list[Node]]:
        """Every domain with its nodes: NVLink cliques from the nodes' records, and the
        domains of one node (an HGX) from their runs."""
        stamps = await self._repo.clique_stamps(DOMAIN_STATES)
        domains: dict[str, list[Node]] = {}
        for node in await self._repo.get_many(list(stamps)):
            if (member := member_of(node)) is not None:
                domains.setdefault(member.clique, []).append(node)
        lone = {d: s.latest.node_ids for d, s in standings.items() if d not in domains}
        if lone:
            found: dict[str, Node] = {n.id: n for n in await self._repo.get_many(
                sorted({i for ids in lone.values() for i in ids}))}
            for domain, ids in lone.items():
                nodes = [found[i] for i in ids if i in found]
                if nodes and all(member_of(n) is None for n in nodes):
                    domains[domain] = nodes
        return domains

    def _running(self, standing: Standing | None, now: datetime) -> bool:
        latest = standing.latest if standing is not None else None
        return latest is not None and latest.status == RUNNING and (
            now <= latest.deadline_at + timedelta(seconds=GRACE_S))

    async def due(self) -> tuple[list[Due], int]:
        """The active domains due, oldest pass first, and how many active domains are under
        a run now."""
        now = self._clock()
        standings = await self._runs.standings()
        due: list[Due] = []
        running = 0
        for domain, nodes in (await self._domains(standings)).items():
            if not nodes or any(n.state is not NodeState.ACTIVE for n in nodes):
                continue
            standing = standings.get(domain)
            if self._running(standing, now):
                running += 1
                continue
            interval = self._interval(nodes[0])
            if interval is None or any(n.maintenance for n in nodes):
                continue
            if standing is not None and (latest := standing.latest).status != PASSED:
                if latest.status not in (INTERRUPTED, RUNNING):  # RUNNING: a dead daemon's
                    continue  # held (or failed and left alone): an operator's to rerun
                if now - latest.started_at < timedelta(seconds=self._settings.reaccept_retry_s):
                    continue
            last_pass = standing.last_pass if standing is not None else None
            if last_pass is None or now - last_pass >= interval:
                due.append(Due(domain, last_pass))
        due.sort(key=lambda d: (d.last_pass is not None, d.last_pass or now, d.domain))
        return due, running

    async def sweep(self) -> list[str]:
        """Start the runs due, up to the cap; the domains started."""
        due, running = await self.due()
        slots = self._settings.reaccept_max_concurrent - running
        started: list[str] = []
        for item in due:
            if len(started) >= slots:
                break
            when = item.last_pass.date().isoformat() if item.last_pass else "never"
            try:
                run = await self._acceptance.rerun(
                    item.domain, _never_retry, requested_by=f"{SWEEP_ACTOR} (last pass {when})")
            except (Conflict, NotFound) as exc:
                log.info("reaccept sweep: %s not started: %s", item.domain, exc)
                continue
            log.info("reaccept sweep: %s (last pass %s) accepted on %s in reservation %s",
                     item.domain, when, ", ".join(run.nodes), run.reservation)
            started.append(item.domain)
        return started

    async def run(self) -> None:
        """Sweep every ``interval_s`` while this daemon leads (cancelled when it stops)."""
        await every(self.interval_s, self.sweep, "reaccept sweep")
