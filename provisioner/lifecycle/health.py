"""Health findings in: reports from every source become records (``store/findings.py``)
and, when a finding opens, reopens, clears or is silenced, a history row on the node through
the conductor (the only writer of node history). Listeners (the repair ladder) hear of
every opening, reopening and clearing: ``HealthFindings.add_listener``.

Sources that report "everything I see now" (the Slurm and Kubernetes syncs) call ``sync``
each pass: only the nodes whose findings changed since the last pass are written, and the
first pass after a start (or after this daemon took the fleet lead) reconciles with the
store, clearing what the source no longer reports. Sources that report one finding at a time
(the API, Alertmanager) call ``report`` and ``resolve``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from provisioner.errors import ProvisionerError
from provisioner.health.model import HealthClass
from provisioner.health.records import Change, FindingRecord, Origin, Outcome, Report
from provisioner.lifecycle.conductor import Conductor
from provisioner.store.findings import FindingRepo

log = logging.getLogger(__name__)

Detected = Callable[[Origin, float], None]
"""Told, for each finding opened or reopened from a report whose source said when it saw the
fault (``Report.seen_at``), the seconds from then to now (``Metrics.observe_detect``)."""
FindingListener = Callable[[FindingRecord, Change], Awaitable[None]]
"""Called after a finding opened, reopened or cleared (its history row written); the
record says whether it is silenced (``record.silenced(now)``)."""

#: the states whose nodes the syncs open findings for (in service, or being repaired);
#: a node in another state (deploying, released...) has its sync findings cleared
OBSERVED_STATES: Final = frozenset({"active", "repairing", "service_required"})
HISTORY_EVENTS: Final = {Change.OPENED: "health_finding", Change.REOPENED: "health_finding",
                         Change.CLEARED: "health_cleared"}


class HealthFindings:
    def __init__(self, repo: FindingRepo, conductor: Conductor, *,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 detected: Detected | None = None) -> None:
        self._repo = repo
        self._detected = detected
        self._conductor = conductor
        self._now = now
        self._listeners: list[FindingListener] = []
        self._synced: dict[Origin, dict[str, frozenset[Report]]] = {}

    @property
    def repo(self) -> FindingRepo:
        return self._repo

    def add_listener(self, listener: FindingListener) -> None:
        """The repair ladder's hook: ``listener(record, change)`` after each opening,
        reopening and clearing."""
        self._listeners.append(listener)

    # -- one at a time (API, Alertmanager) ----------------------------------------------------

    async def report(self, node_id: str, origin: Origin, reports: Iterable[Report], *,
                     actor: str) -> list[Outcome]:
        reports = list(reports)
        outcomes = [await self._repo.observe(node_id, origin, report) for report in reports]
        self._time(origin, reports, outcomes)
        await self._after(outcomes, actor)
        return outcomes

    async def resolve(self, node_id: str, origin: Origin, cls: HealthClass, subject: str, *,
                      actor: str) -> Outcome | None:
        outcome = await self._repo.clear(node_id, origin, cls, subject)
        if outcome is not None:
            await self._after([outcome], actor)
        return outcome

    async def silence(self, node_id: str, duration_s: float, *, reason: str, actor: str,
                      cls: HealthClass | None = None,
                      finding_id: int | None = None) -> list[FindingRecord]:
        until = self._now() + timedelta(seconds=duration_s)
        records = await self._repo.silence(node_id, until, reason=reason, actor=actor,
                                           cls=cls, finding_id=finding_id)
        what = f"finding {finding_id}" if finding_id is not None else f"class {cls}"
        await self._record(node_id, "health_silenced", actor,
                           f"{what} silenced until {until.isoformat(timespec='seconds')} "
                           f"({len(records)} findings): {reason}")
        return records

    # -- whole-fleet passes (Slurm and Kubernetes syncs) ------------------------------------

    async def sync(self, origin: Origin, by_hostname: Mapping[str, Sequence[Report]]) -> int:
        """``by_hostname``: every node ``origin`` knows, with what it reports of it now
        (nodes that are not ours are ignored). Returns how many nodes were written."""
        first = origin not in self._synced
        last = self._synced.get(origin, {})
        now = {host: frozenset(r.clipped() for r in reports)
               for host, reports in by_hostname.items()}
        changed = {host for host, reports in now.items() if last.get(host, frozenset()) != reports}
        changed |= {host for host in last if host not in now and last[host]}
        nodes = await self._repo.nodes_named(changed) if changed else {}
        stale: set[str] = set()
        if first:  # what the store holds open from this origin for nodes not seen changed
            held = await self._repo.open_keys(origin)
            seen = {nodes[h][0] for h in changed if h in nodes}
            stale = set(held) - seen
        applied = {host: r for host, r in now.items() if host not in changed and r}
        written = 0
        for host in sorted(changed):
            if host not in nodes:  # not ours
                applied[host] = now.get(host, frozenset())
                continue
            node_id, state = nodes[host]
            reports = sorted(now.get(host, frozenset()), key=lambda r: r.key)
            observed = state in OBSERVED_STATES
            written += await self._reconcile(node_id, origin, reports if observed else [])
            if observed:  # else asked again next pass: it may be in service by then
                applied[host] = now.get(host, frozenset())
        for node_id in sorted(stale):
            written += await self._reconcile(node_id, origin, [])
        self._synced[origin] = {host: r for host, r in applied.items() if r}
        await self._repo.touch(origin)
        return written

    def forget(self, origin: Origin) -> None:
        """The next ``sync`` of ``origin`` reconciles with the store again (lead moved)."""
        self._synced.pop(origin, None)

    async def _reconcile(self, node_id: str, origin: Origin, reports: list[Report]) -> int:
        outcomes = await self._repo.reconcile(node_id, origin, reports)
        self._time(origin, reports, outcomes)
        await self._after(outcomes, f"sync:{origin}")
        return 1 if any(o.change is not Change.SEEN for o in outcomes) else 0

    # -- history and listeners --------------------------------------------------------------

    def _time(self, origin: Origin, reports: Sequence[Report],
              outcomes: Sequence[Outcome]) -> None:
        if self._detected is None:
            return
        seen = {r.key: r.seen_at for r in reports if r.seen_at is not None}
        for outcome in outcomes:
            if outcome.change not in (Change.OPENED, Change.REOPENED):
                continue
            at = seen.get((str(outcome.record.cls), outcome.record.subject))
            if at is not None:
                self._detected(origin, max(0.0, (self._now() - at).total_seconds()))

    async def _after(self, outcomes: Sequence[Outcome], actor: str) -> None:
        for outcome in outcomes:
            event = HISTORY_EVENTS.get(outcome.change)
            if event is None:
                continue
            record = outcome.record
            verb = {Change.OPENED: "opened", Change.REOPENED: "reopened",
                    Change.CLEARED: "cleared"}[outcome.change]
            silenced = " [silenced]" if record.silenced(self._now()) else ""
            await self._record(record.node_id, event, actor,
                               f"{verb}{silenced}: {record.summary()}")
            for listener in self._listeners:
                try:
                    await listener(record, outcome.change)
                except ProvisionerError as exc:
                    log.warning("node %s: health listener failed on finding %d: %s",
                                record.node_id, record.id, exc)

    async def _record(self, node_id: str, event: str, actor: str, reason: str) -> None:
        # another writer moving the node between read and write: the conductor reads again
        await self._conductor.record(node_id, event, actor=actor, reason=reason[:4096],
                                     level=logging.WARNING)
