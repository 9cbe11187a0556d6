"""WaveRepo: firmware waves (table ``firmware_wave``, issue 25). A wave's whole state is
its row, so a daemon restarted, or another one taking the ``fleet`` singleton over, drives it
on from where it was. Every write compares the row's ``version``; the driver's writes also
check, in the same transaction, that it still leads the ``fleet`` singleton with the fence
it was given (a daemon that lost the lead never writes a wave again)."""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Final

from sqlmodel import Session, col, select

from provisioner.errors import Conflict, NotFound
from provisioner.store.models import FirmwareWaveRow, SingletonRow, utcnow
from provisioner.store.session import SessionRepo

RUNNING: Final = "running"
STOPPED: Final = "stopped"
FAILED: Final = "failed"
DONE: Final = "done"
WAVE_STATUSES: Final = (RUNNING, STOPPED, FAILED, DONE)
OPEN: Final = frozenset({"starting", "running"})
"""A wave's nodes whose runbook may still run: the wave is settled (``finished_at``) only
once it is not running and none is left."""
LEAD: Final = "fleet"
"""The singleton whose leader drives the waves."""


@dataclass(frozen=True, slots=True)
class WaveNode:
    status: str  # starting, running, passed, failed
    name: str
    domain: str | None
    rack: str | None

    def to_json(self) -> dict[str, str | None]:
        return {"status": self.status, "name": self.name, "domain": self.domain,
                "rack": self.rack}


@dataclass(frozen=True, slots=True)
class Wave:
    id: str
    profile: str
    runbook: str
    max_nodes: int
    max_domain_share: float
    max_rack_share: float
    stop_after_failures: int
    status: str = RUNNING
    reason: str = ""
    nodes: Mapping[str, WaveNode] = field(default_factory=dict)
    domain_sizes: Mapping[str, int] = field(default_factory=dict)
    rack_sizes: Mapping[str, int] = field(default_factory=dict)
    failures: int = 0
    version: int = 1
    started_by: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None

    def count(self, status: str) -> int:
        return sum(1 for n in self.nodes.values() if n.status == status)

    def with_node(self, node_id: str, status: str) -> Wave:
        return replace(self, nodes={**self.nodes, node_id: replace(self.nodes[node_id],
                                                                   status=status)})


def _aware(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def _wave(row: FirmwareWaveRow) -> Wave:
    nodes = {str(k): WaveNode(str(v.get("status", "")), str(v.get("name", "")),
                              v.get("domain"), v.get("rack"))
             for k, v in json.loads(row.nodes).items()}
    groups = json.loads(row.groups)
    return Wave(id=row.id, profile=row.profile, runbook=row.runbook, max_nodes=row.max_nodes,
                max_domain_share=row.max_domain_share, max_rack_share=row.max_rack_share,
                stop_after_failures=row.stop_after_failures, status=row.status,
                reason=row.reason, nodes=nodes,
                domain_sizes={str(k): int(v) for k, v in groups.get("domains", {}).items()},
                rack_sizes={str(k): int(v) for k, v in groups.get("racks", {}).items()},
                failures=row.failures, version=row.version, started_by=row.started_by,
                created_at=_aware(row.created_at), updated_at=_aware(row.updated_at),
                finished_at=_aware(row.finished_at))


def _fill(row: FirmwareWaveRow, wave: Wave) -> None:
    row.status, row.reason, row.failures = wave.status, wave.reason[:1024], wave.failures
    row.nodes = json.dumps({k: v.to_json() for k, v in wave.nodes.items()})
    row.groups = json.dumps({"domains": dict(wave.domain_sizes),
                             "racks": dict(wave.rack_sizes)})
    row.updated_at = utcnow()
    if wave.status != RUNNING and row.finished_at is None and not any(
            n.status in OPEN for n in wave.nodes.values()):
        row.finished_at = row.updated_at


class WaveRepo(SessionRepo):
    async def create(self, wave: Wave) -> Wave:
        """A new running wave; Conflict while the profile has one running."""

        def work(s: Session) -> Wave:
            running = s.exec(select(FirmwareWaveRow.id).where(
                col(FirmwareWaveRow.profile) == wave.profile,
                col(FirmwareWaveRow.status) == RUNNING)).first()
            if running is not None:
                raise Conflict(f"profile {wave.profile} has a running firmware wave "
                               f"({running}); stop it first")
            row = FirmwareWaveRow(
                id=wave.id, profile=wave.profile, runbook=wave.runbook,
                max_nodes=wave.max_nodes, max_domain_share=wave.max_domain_share,
                max_rack_share=wave.max_rack_share,
                stop_after_failures=wave.stop_after_failures, nodes="{}", groups="{}",
                started_by=wave.started_by[:128], status=RUNNING)
            _fill(row, wave)
            s.add(row)
            s.commit()
            return _wave(row)

        return await self._run(work)

    async def get(self, wave_id: str) -> Wave:
        def work(s: Session) -> Wave:
            row = s.get(FirmwareWaveRow, wave_id)
            if row is None:
                raise NotFound("firmware wave", wave_id)
            return _wave(row)

        return await self._run(work)

    async def list(self, *, status: str | None = None,
                   limit: int = 100) -> builtins.list[Wave]:
        """Newest first."""

        def work(s: Session) -> builtins.list[Wave]:
            query = select(FirmwareWaveRow)
            if status is not None:
                query = query.where(col(FirmwareWaveRow.status) == status)
            rows = s.exec(query.order_by(col(FirmwareWaveRow.created_at).desc())
                          .limit(limit)).all()
            return [_wave(r) for r in rows]

        return await self._run(work)

    async def unsettled(self) -> builtins.list[Wave]:
        """Running waves, and ended ones whose nodes' runbooks may still run."""

        def work(s: Session) -> builtins.list[Wave]:
            rows = s.exec(select(FirmwareWaveRow).where(col(FirmwareWaveRow.finished_at)
                                                        .is_(None))).all()
            return [_wave(r) for r in rows]

        return await self._run(work)

    async def save(self, wave: Wave, *, lead: tuple[str, int] | None = None) -> Wave | None:
        """Write ``wave`` if the row is still at ``wave.version`` (and, with ``lead``
        (instance, fence), this instance still leads the ``fleet`` singleton with that
        fence); the wave as written, None when either check failed (read it again)."""

        def work(s: Session) -> Wave | None:
            if lead is not None:
                single = s.exec(select(SingletonRow).where(col(SingletonRow.name) == LEAD)
                                .with_for_update()).first()
                if single is None or (single.owner, single.fence) != lead:
                    return None
            row = s.exec(select(FirmwareWaveRow).where(col(FirmwareWaveRow.id) == wave.id)
                         .with_for_update()).first()
            if row is None or row.version != wave.version:
                return None
            _fill(row, wave)
            row.version = wave.version + 1
            s.add(row)
            s.commit()
            return _wave(row)

        return await self._run(work)

    async def stop(self, wave_id: str, *, actor: str) -> Wave:
        """An operator's stop: no node is started after it (those being serviced finish)."""
        for _ in range(20):
            wave = await self.get(wave_id)
            if wave.status != RUNNING:
                return wave
            saved = await self.save(replace(wave, status=STOPPED, reason=f"stopped by {actor}"))
            if saved is not None:
                return saved
        raise Conflict(f"firmware wave {wave_id} changed 20 times while being stopped")
