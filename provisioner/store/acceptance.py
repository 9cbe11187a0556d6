"""AcceptanceRepo: fabric acceptance runs (table ``fabric_acceptance``), one row per run of a
domain; the latest row of a domain is its standing. Blocking work runs in the ``store`` pool.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import func
from sqlmodel import Session, col, select

from provisioner.store.models import FabricAcceptanceRow, utcnow
from provisioner.store.session import SessionRepo

RUNNING: Final = "running"
PASSED: Final = "passed"
FAILED: Final = "failed"
INTERRUPTED: Final = "interrupted"


@dataclass(frozen=True, slots=True)
class AcceptanceRun:
    id: str
    domain: str
    fabric_class: str
    status: str
    nodes: tuple[tuple[str, str], ...]  # (node id, name)
    summary: str
    slowest: str | None
    result: Mapping[str, Any]
    requested_by: str
    instance: str | None
    started_at: datetime
    deadline_at: datetime
    finished_at: datetime | None

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(node_id for node_id, _ in self.nodes)

    @property
    def held(self) -> bool:
        """A failed run that kept its Slurm maintenance reservation: the domain is held."""
        reservation = self.result.get("reservation")
        return (self.status == FAILED and isinstance(reservation, Mapping)
                and bool(reservation.get("held")))


@dataclass(frozen=True, slots=True)
class Standing:
    """A domain's latest run and when its last passed run finished (None: never)."""

    latest: AcceptanceRun
    last_pass: datetime | None


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # SQLite


def _run(row: FabricAcceptanceRow) -> AcceptanceRun:
    return AcceptanceRun(
        id=row.id, domain=row.domain, fabric_class=row.fabric_class, status=row.status,
        nodes=tuple((str(i), str(n)) for i, n in json.loads(row.nodes)), summary=row.summary,
        slowest=row.slowest, result=json.loads(row.result), requested_by=row.requested_by,
        instance=row.instance, started_at=_aware(row.started_at),
        deadline_at=_aware(row.deadline_at),
        finished_at=_aware(row.finished_at) if row.finished_at else None)


class AcceptanceRepo(SessionRepo):
    async def start(self, run_id: str, domain: str, fabric_class: str,
                    nodes: Sequence[tuple[str, str]], *, deadline_at: datetime,
                    requested_by: str, instance: str | None) -> AcceptanceRun:
        def work(s: Session) -> AcceptanceRun:
            row = FabricAcceptanceRow(
                id=run_id, domain=domain, fabric_class=fabric_class, status=RUNNING,
                nodes=json.dumps([list(n) for n in nodes]), result="{}",
                requested_by=requested_by[:128], instance=instance, deadline_at=deadline_at)
            s.add(row)
            s.commit()
            return _run(row)

        return await self._run(work)

    async def finish(self, run_id: str, status: str, *, summary: str, slowest: str | None,
                     result: Mapping[str, Any]) -> AcceptanceRun:
        def work(s: Session) -> AcceptanceRun:
            row = s.get(FabricAcceptanceRow, run_id)
            if row is None:
                raise LookupError(run_id)
            row.status, row.summary, row.slowest = status, summary[:4096], slowest
            row.result = json.dumps(result, sort_keys=True)
            row.finished_at = utcnow()
            s.add(row)
            s.commit()
            return _run(row)

        return await self._run(work)

    async def latest(self, domain: str) -> AcceptanceRun | None:
        def work(s: Session) -> AcceptanceRun | None:
            row = s.exec(select(FabricAcceptanceRow)
                         .where(FabricAcceptanceRow.domain == domain)
                         .order_by(col(FabricAcceptanceRow.started_at).desc())
                         .limit(1)).first()
            return _run(row) if row is not None else None

        return await self._run(work)

    async def held_nodes(self) -> set[str]:
        """The node names of every domain whose latest run failed and kept its Slurm
        reservation (``result["reservation"]["held"]``: an active domain held); a rerun going
        on keeps the domain held until it passed."""
        def work(s: Session) -> set[str]:
            latest: dict[str, FabricAcceptanceRow] = {}
            for row in s.exec(select(FabricAcceptanceRow)
                              .where(FabricAcceptanceRow.status != RUNNING)
                              .order_by(col(FabricAcceptanceRow.started_at))):
                latest[row.domain] = row  # the last finished one of each domain wins
            held: set[str] = set()
            for row in latest.values():
                if row.status != FAILED or '"held": true' not in row.result:
                    continue
                reservation = json.loads(row.result).get("reservation") or {}
                if reservation.get("held"):
                    held.update(str(name) for _, name in json.loads(row.nodes))
            return held

        return await self._run(work)

    async def get(self, run_id: str) -> AcceptanceRun | None:
        def work(s: Session) -> AcceptanceRun | None:
            row = s.get(FabricAcceptanceRow, run_id)
            return _run(row) if row is not None else None

        return await self._run(work)

    async def standings(self) -> dict[str, Standing]:
        """Every domain that ever had a run: its latest run and its last pass."""
        def work(s: Session) -> dict[str, Standing]:
            row = FabricAcceptanceRow
            newest = (select(row.domain, func.max(row.started_at).label("at"))
                      .group_by(row.domain).subquery())
            latest = s.exec(select(row).join(newest, (col(row.domain) == newest.c.domain)
                                             & (col(row.started_at) == newest.c.at))).all()
            passes = dict(s.exec(select(row.domain, func.max(row.finished_at))
                                 .where(row.status == PASSED).group_by(row.domain)).all())
            out: dict[str, Standing] = {}
            for found in sorted(latest, key=lambda r: (r.domain, r.started_at)):
                last_pass = passes.get(found.domain)
                out[found.domain] = Standing(_run(found),
                                             _aware(last_pass) if last_pass else None)
            return out

        return await self._run(work)
