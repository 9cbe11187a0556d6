"""FindingRepo: the health findings of nodes (table ``health_finding``) and per-node class
silences (``health_silence``). Blocking work runs in the ``store`` pool.

A finding is keyed by (node, origin, class, subject): ``observe`` updates the one row
(``last_seen``, ``count``, evidence, action) or reopens it when it was cleared; the table
holds at most one row per key whatever the rate of reports. History rows are not written
here: the conductor records openings, clearings and silences (it is the only writer of a
node's history).
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlmodel import Session, col, select

from provisioner.errors import NotFound
from provisioner.health.model import Action, HealthClass
from provisioner.health.records import Change, FindingRecord, Origin, Outcome, Report
from provisioner.store.models import (
    HealthBreakerRow,
    HealthCursorRow,
    HealthFindingRow,
    HealthSilenceRow,
    NodeRow,
    utcnow,
)
from provisioner.store.session import SessionRepo

TOUCH_AFTER = timedelta(minutes=5)
"""How stale a sync's open finding's ``last_seen`` may grow before a pass bumps it."""
_KEY = ["node_id", "origin", "health_class", "subject"]
BREAKER = "fleet"
Saved = tuple[str, str, dict[str, str]]
"""The repair breaker as stored: (reason, since, held node id -> finding line)."""


@dataclass(frozen=True, slots=True)
class FindingFilter:
    node_id: str | None = None
    cls: str | None = None
    origin: str | None = None
    open_only: bool = True


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def to_record(row: HealthFindingRow, hostname: str | None = None) -> FindingRecord:
    assert row.id is not None
    return FindingRecord(
        id=row.id, node_id=row.node_id, origin=Origin(row.origin),
        cls=HealthClass(row.health_class),
        action=Action(row.action), evidence=row.evidence, subject=row.subject,
        first_seen=_utc(row.first_seen) or utcnow(), last_seen=_utc(row.last_seen) or utcnow(),
        count=row.count, cleared_at=_utc(row.cleared_at),
        silenced_until=_utc(row.silenced_until), silence_reason=row.silence_reason,
        silenced_by=row.silenced_by, hostname=hostname)


class FindingRepo(SessionRepo):
    # -- writes -----------------------------------------------------------------------------

    async def observe(self, node_id: str, origin: Origin, report: Report) -> Outcome:
        """Record one report: a new row, the row reopened, or the open row seen again."""
        return await self._run(lambda s: self._observe(s, node_id, origin, report.clipped()))

    async def reconcile(self, node_id: str, origin: Origin,
                        reports: Sequence[Report]) -> builtins.list[Outcome]:
        """``reports`` are all that ``origin`` says of the node now: each is observed, and
        the node's other open findings from ``origin`` are cleared (one transaction)."""
        def work(s: Session) -> builtins.list[Outcome]:
            clipped = [report.clipped() for report in reports]
            outcomes = [self._observe(s, node_id, origin, report, commit=False)
                        for report in clipped]
            keep = {report.key for report in clipped}
            now = utcnow()
            for row in self._open_rows(s, node_id, origin):
                if (row.health_class, row.subject) not in keep:
                    row.cleared_at = now
                    s.add(row)
                    outcomes.append(Outcome(to_record(row), Change.CLEARED))
            s.commit()
            return outcomes

        return await self._run(work)

    async def clear(self, node_id: str, origin: Origin, cls: HealthClass,
                    subject: str) -> Outcome | None:
        """Clear the open finding with that key; None when there is none."""
        def work(s: Session) -> Outcome | None:
            row = self._row(s, node_id, origin, str(cls), subject.strip()[:128])
            if row is None or row.cleared_at is not None:
                return None
            row.cleared_at = utcnow()
            s.add(row)
            s.commit()
            return Outcome(to_record(row), Change.CLEARED)

        return await self._run(work)

    async def touch(self, origin: Origin, *, older_than: timedelta = TOUCH_AFTER) -> int:
        """Bump ``last_seen`` of the open findings from ``origin`` seen last more than
        ``older_than`` ago (a sync pass saw them all again): one statement, whatever the
        number of findings. Not every pass: a sync every 30 s would rewrite every open
        finding of a fleet at rest twice a minute; ``last_seen`` is true to ``TOUCH_AFTER``."""
        def work(s: Session) -> int:
            now = utcnow()
            result = s.execute(update(HealthFindingRow).where(
                col(HealthFindingRow.origin) == str(origin),
                col(HealthFindingRow.cleared_at).is_(None),
                col(HealthFindingRow.last_seen) <= now - older_than).values(last_seen=now))
            s.commit()
            return int(result.rowcount)  # type: ignore[attr-defined]

        return await self._run(work)

    async def silence(self, node_id: str, until: datetime, *, reason: str, actor: str,
                      cls: HealthClass | None = None,
                      finding_id: int | None = None) -> builtins.list[FindingRecord]:
        """Silence one finding (``finding_id``) or a class on the node (its findings now
        and those opened before ``until``); the records silenced."""
        def work(s: Session) -> builtins.list[FindingRecord]:
            query = select(HealthFindingRow).where(col(HealthFindingRow.node_id) == node_id)
            if finding_id is not None:
                query = query.where(col(HealthFindingRow.id) == finding_id)
            else:
                assert cls is not None
                query = query.where(col(HealthFindingRow.health_class) == str(cls))
                silence = s.get(HealthSilenceRow, (node_id, str(cls))) or HealthSilenceRow(
                    node_id=node_id, health_class=str(cls), until=until)
                silence.until, silence.reason, silence.actor = until, reason, actor
                s.add(silence)
            rows = s.exec(query).all()
            if finding_id is not None and not rows:
                raise NotFound("finding", str(finding_id))
            for row in rows:
                row.silenced_until, row.silence_reason, row.silenced_by = until, reason, actor
                s.add(row)
            s.commit()
            return [to_record(row) for row in rows]

        return await self._run(work)

    # -- reads ------------------------------------------------------------------------------

    async def list(self, where: FindingFilter, *, limit: int = 100,
                   offset: int = 0) -> tuple[builtins.list[FindingRecord], int]:
        """Findings, newest sighting first, with their node's hostname; and the total."""
        def work(s: Session) -> tuple[builtins.list[FindingRecord], int]:
            conditions = _conditions(where)
            total = s.exec(select(func.count()).select_from(HealthFindingRow)
                           .where(*conditions)).one()
            rows = s.exec(
                select(HealthFindingRow, NodeRow.hostname)
                .join(NodeRow, col(NodeRow.id) == col(HealthFindingRow.node_id))
                .where(*conditions)
                .order_by(col(HealthFindingRow.last_seen).desc(), col(HealthFindingRow.id))
                .limit(limit).offset(offset)).all()
            return [to_record(row, hostname) for row, hostname in rows], int(total)

        return await self._run(work)

    async def open_keys(self, origin: Origin) -> dict[str, set[tuple[str, str]]]:
        """node id -> (class, subject) of its open findings from ``origin``."""
        def work(s: Session) -> dict[str, set[tuple[str, str]]]:
            rows = s.exec(select(HealthFindingRow.node_id, HealthFindingRow.health_class,
                                 HealthFindingRow.subject).where(
                col(HealthFindingRow.origin) == str(origin),
                col(HealthFindingRow.cleared_at).is_(None))).all()
            found: dict[str, set[tuple[str, str]]] = {}
            for node_id, cls, subject in rows:
                found.setdefault(node_id, set()).add((cls, subject))
            return found

        return await self._run(work)

    async def nodes_named(self, hostnames: Iterable[str]) -> dict[str, tuple[str, str]]:
        """hostname -> (node id, state) of the nodes with those hostnames (one query)."""
        names = sorted(set(hostnames))

        def work(s: Session) -> dict[str, tuple[str, str]]:
            found: dict[str, tuple[str, str]] = {}
            for start in range(0, len(names), 500):
                rows = s.exec(select(NodeRow.hostname, NodeRow.id, NodeRow.state).where(
                    col(NodeRow.hostname).in_(names[start:start + 500]))).all()
                found.update({h: (i, st) for h, i, st in rows if h is not None})
            return found

        return await self._run(work)

    async def cursors(self, source: str) -> dict[str, str]:
        """node id -> its cursor for ``source`` (the BMC poller reads them once a sweep)."""
        def work(s: Session) -> dict[str, str]:
            rows = s.exec(select(HealthCursorRow.node_id, HealthCursorRow.cursor).where(
                col(HealthCursorRow.source) == source)).all()
            return {node_id: cursor for node_id, cursor in rows}

        return await self._run(work)

    async def cursor(self, node_id: str, source: str) -> str | None:
        """One node's cursor for ``source`` (the in-band intake reads it per post)."""
        def work(s: Session) -> str | None:
            row = s.get(HealthCursorRow, (node_id, source))
            return None if row is None else row.cursor

        return await self._run(work)

    async def set_cursor(self, node_id: str, source: str, cursor: str) -> None:
        def work(s: Session) -> None:
            row = s.get(HealthCursorRow, (node_id, source))
            if row is None:
                if s.get(NodeRow, node_id) is None:  # deleted meanwhile: nothing to keep
                    return
                row = HealthCursorRow(node_id=node_id, source=source, cursor=cursor)
            row.cursor, row.updated_at = cursor, utcnow()
            s.add(row)
            s.commit()

        await self._run(work)

    async def load_breaker(self) -> Saved | None:
        """The repair breaker as last saved: (reason, since, held) when open, else None."""
        def work(s: Session) -> Saved | None:
            row = s.get(HealthBreakerRow, BREAKER)
            return None if row is None else _breaker(row)

        return await self._run(work)

    async def change_breaker(self, change: Callable[[Saved | None], Saved | None]
                             ) -> Saved | None:
        """``change`` applied to the breaker as stored now, read and written under its
        row's lock; the breaker after. Two daemons holding findings at once, or an
        operator's reset meanwhile, are never overwritten by a copy read earlier."""
        def work(s: Session) -> Saved | None:
            insert = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
            s.execute(insert(HealthBreakerRow).values(
                name=BREAKER, tripped=False, reason="", since="", held="{}",
                updated_at=utcnow()).on_conflict_do_nothing(index_elements=["name"]))
            row = s.exec(select(HealthBreakerRow).where(col(HealthBreakerRow.name) == BREAKER)
                         .with_for_update()).one()
            state = change(_breaker(row))
            reason, since, held = state or ("", "", {})
            row.tripped, row.reason, row.since = state is not None, reason, since
            row.held, row.updated_at = json.dumps(held, sort_keys=True), utcnow()
            s.add(row)
            s.commit()
            return state

        return await self._run(work)

    async def open_counts(self) -> dict[str, int]:
        """Open, unsilenced findings per class (the ``provisioner_health_findings`` gauge)."""
        def work(s: Session) -> dict[str, int]:
            now = utcnow()
            rows = s.exec(select(HealthFindingRow.health_class, func.count()).where(
                col(HealthFindingRow.cleared_at).is_(None),
                (col(HealthFindingRow.silenced_until).is_(None))
                | (col(HealthFindingRow.silenced_until) <= now))
                .group_by(col(HealthFindingRow.health_class))).all()
            counts = {str(cls): 0 for cls in HealthClass}  # every class: a drop to 0 shows
            counts.update({cls: int(count) for cls, count in rows})
            return counts

        return await self._run(work)

    # -- inside a session -------------------------------------------------------------------

    def _observe(self, s: Session, node_id: str, origin: Origin, report: Report, *,
                 commit: bool = True) -> Outcome:
        change = Change.SEEN
        row = self._row(s, node_id, origin, str(report.cls), report.subject, lock=True)
        now = utcnow()  # once the row is ours: the last writer's time is the latest
        if row is None:  # insert unless another daemon just did: no rollback either way
            insert = (pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert)
            inserted = s.execute(insert(HealthFindingRow).values(
                node_id=node_id, origin=str(origin), health_class=str(report.cls),
                subject=report.subject, action=str(report.action), evidence=report.evidence,
                first_seen=now, last_seen=now, count=0, silence_reason="", silenced_by="",
            ).on_conflict_do_nothing(index_elements=_KEY).returning(col(HealthFindingRow.id))).first()
            change = Change.OPENED if inserted is not None else Change.SEEN
            row = self._row(s, node_id, origin, str(report.cls), report.subject, lock=True)
            assert row is not None
            if change is Change.OPENED:
                self._inherit_silence(s, row, now)
        if change is not Change.OPENED and row.cleared_at is not None:
            change = Change.REOPENED
            row.first_seen, row.count, row.cleared_at = now, 0, None
            self._inherit_silence(s, row, now)
        row.last_seen, row.count = now, row.count + 1
        row.action, row.evidence = str(report.action), report.evidence
        s.add(row)
        if commit:
            s.commit()
        else:
            s.flush()
        return Outcome(to_record(row), change)

    @staticmethod
    def _inherit_silence(s: Session, row: HealthFindingRow, now: datetime) -> None:
        silence = s.get(HealthSilenceRow, (row.node_id, row.health_class))
        if silence is not None and (_utc(silence.until) or now) > now:
            row.silenced_until, row.silence_reason = silence.until, silence.reason
            row.silenced_by = silence.actor

    @staticmethod
    def _row(s: Session, node_id: str, origin: Origin, cls: str, subject: str, *,
             lock: bool = False) -> HealthFindingRow | None:
        query = select(HealthFindingRow).where(
            col(HealthFindingRow.node_id) == node_id,
            col(HealthFindingRow.origin) == str(origin), col(HealthFindingRow.health_class) == cls,
            col(HealthFindingRow.subject) == subject)
        return s.exec(query.with_for_update() if lock else query).first()

    @staticmethod
    def _open_rows(s: Session, node_id: str, origin: Origin) -> Iterable[HealthFindingRow]:
        return s.exec(select(HealthFindingRow).where(
            col(HealthFindingRow.node_id) == node_id,
            col(HealthFindingRow.origin) == str(origin),
            col(HealthFindingRow.cleared_at).is_(None))).all()


def _breaker(row: HealthBreakerRow) -> Saved | None:
    if not row.tripped:
        return None
    held = json.loads(row.held or "{}")
    return row.reason, row.since, {str(k): str(v) for k, v in held.items()}


def _conditions(where: FindingFilter) -> builtins.list[Any]:
    conditions: builtins.list[Any] = []
    if where.node_id is not None:
        conditions.append(col(HealthFindingRow.node_id) == where.node_id)
    if where.cls is not None:
        conditions.append(col(HealthFindingRow.health_class) == where.cls)
    if where.origin is not None:
        conditions.append(col(HealthFindingRow.origin) == where.origin)
    if where.open_only:
        conditions.append(col(HealthFindingRow.cleared_at).is_(None))
    return conditions
