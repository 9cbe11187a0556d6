"""OwnershipRepo: which daemon drives which node (DESIGN §7), which daemons are alive, and
which one runs the fleet-wide singletons.

A node's lease row is claimed with ``SELECT … FOR UPDATE SKIP LOCKED``; every claim bumps
its fencing number. ``NodeRepo`` checks (owner, fence) in the same transaction as each fenced
write, so a daemon that lost a lease (paused, partitioned, presumed dead) can never write for
that node again. ``exclusive`` (SQLite: one daemon per file, enforced by a lock file) lets a
claim take leases left by an earlier incarnation at once instead of waiting for expiry.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Row, delete, func, or_, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from provisioner.store import hot_sql as sql
from provisioner.store.models import InstanceRow, NodeLeaseRow, NodeRow, SingletonRow, utcnow
from provisioner.store.session import SessionRepo


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    id: str
    api_listen: str
    started_at: datetime
    heartbeat_at: datetime
    leases: int  # nodes whose lease it holds now
    singletons: tuple[str, ...]  # the singletons it leads now


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    node_id: str
    owner: str | None
    fence: int
    expires_at: datetime | None


def _aware(at: datetime | None) -> datetime | None:
    """SQLite hands datetimes back naive (they were stored as UTC)."""
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


class OwnershipRepo(SessionRepo):
    def __init__(self, engine: Engine, pool: ThreadPoolExecutor, *, instance: str,
                 lease_s: float, exclusive: bool) -> None:
        super().__init__(engine, pool, retry_s=0.0)  # a lease round fails fast, retries next
        self.instance = instance
        self.lease_s = lease_s
        self.exclusive = exclusive

    def close(self) -> None:
        self._pool.shutdown(wait=True)  # the store's pool (SQLite) or its own

    def _expiry(self) -> datetime:
        return utcnow() + timedelta(seconds=self.lease_s)

    def _takeable(self, row: NodeLeaseRow | SingletonRow | Row[Any], now: datetime) -> bool:
        if row.owner is None or row.owner == self.instance or self.exclusive:
            return True
        expires = _aware(row.expires_at)
        return expires is None or expires <= now

    # -- node leases ----------------------------------------------------------------------------

    async def claim(self, node_id: str, *, force: bool = False) -> int | None:
        """Take the node's lease (free, expired, ours, or ``force``: an operator's abort);
        the new fencing number, or None when another live daemon holds it (or is claiming
        it right now)."""

        def work(s: Session) -> int | None:
            now = utcnow()
            # a forced claim waits for a write in progress (it fences the next one); plain
            # rows and statements built once (hot_sql): a node's steps claim it twice
            row = s.execute(sql.LEASE_TO_FORCE if force else sql.LEASE_TO_CLAIM,
                            {"b_id": node_id}).first()
            if row is None:
                return self._first_claim(s, node_id)
            if not (force or self._takeable(row, now)):
                s.rollback()
                return None
            fence = int(row.fence) + 1
            s.execute(sql.TAKE_LEASE, {"b_id": node_id, "owner": self.instance,
                                       "fence": fence, "expires_at": self._expiry()})
            s.commit()
            return fence

        return await self._run(work)

    def _first_claim(self, s: Session, node_id: str) -> int | None:
        """No row we could lock: locked by a claimer (None) or missing (a node enrolled
        before leases existed): create it, ours."""
        if s.exec(select(NodeLeaseRow.node_id)
                  .where(col(NodeLeaseRow.node_id) == node_id)).first() is not None:
            s.rollback()
            return None
        if s.get(NodeRow, node_id) is None:
            s.rollback()
            return None
        return self._first_row(s, NodeLeaseRow(node_id=node_id, owner=self.instance, fence=1,
                                               expires_at=self._expiry()))

    @staticmethod
    def _first_row(s: Session, row: NodeLeaseRow | SingletonRow) -> int | None:
        """Insert the first lease or lead row, ours with fencing number 1; None when another
        daemon inserted it first."""
        s.add(row)
        try:
            s.commit()
        except IntegrityError:
            s.rollback()
            return None
        return 1

    async def claim_orphans(self, states: Iterable[str], limit: int) -> dict[str, int]:
        """Claim up to ``limit`` nodes in ``states`` whose lease is free or expired (their
        daemon died or was cut off): ``{node id: fence}``. Rows other daemons are claiming
        at this moment are skipped, not waited for."""
        wanted = list(states)

        def work(s: Session) -> dict[str, int]:
            now = utcnow()
            # expired: a dead daemon's, or one of ours whose step stopped (not renewed)
            free = or_(col(NodeLeaseRow.owner).is_(None), col(NodeLeaseRow.expires_at) <= now)
            if self.exclusive:  # the only daemon: an earlier incarnation's are free too
                free = or_(free, col(NodeLeaseRow.owner) != self.instance)
            rows = s.exec(
                select(NodeLeaseRow)
                .join(NodeRow, col(NodeRow.id) == col(NodeLeaseRow.node_id))
                .where(col(NodeRow.state).in_(wanted), free)
                .order_by(col(NodeLeaseRow.node_id)).limit(limit)
                .with_for_update(skip_locked=True, of=NodeLeaseRow)).all()
            claimed: dict[str, int] = {}
            for row in rows:
                row.owner, row.fence, row.expires_at = (self.instance, row.fence + 1,
                                                        self._expiry())
                s.add(row)
                claimed[row.node_id] = row.fence
            s.commit()
            return claimed

        return await self._run(work)

    async def renew(self, fences: dict[str, int]) -> builtins.set[str]:
        """Extend the leases we hold with these fencing numbers; the node ids still ours."""
        if not fences:
            return set()

        def work(s: Session) -> builtins.set[str]:
            rows = s.exec(select(NodeLeaseRow).where(
                col(NodeLeaseRow.owner) == self.instance,
                col(NodeLeaseRow.node_id).in_(list(fences)))).all()
            ours = {r.node_id for r in rows if fences.get(r.node_id) == r.fence}
            if ours:
                s.execute(update(NodeLeaseRow)
                          .where(col(NodeLeaseRow.owner) == self.instance,
                                 col(NodeLeaseRow.node_id).in_(sorted(ours)))
                          .values(expires_at=self._expiry()))
            s.commit()
            return ours

        return await self._run(work)

    async def release(self, node_id: str, fence: int) -> None:
        """Free a lease we claimed but did not use (our write lost a race)."""

        def work(s: Session) -> None:
            s.execute(update(NodeLeaseRow).where(
                col(NodeLeaseRow.node_id) == node_id, col(NodeLeaseRow.owner) == self.instance,
                col(NodeLeaseRow.fence) == fence).values(owner=None, expires_at=None))
            s.commit()

        await self._run(work)

    async def release_all(self) -> int:
        """At a clean stop: free our leases so another daemon resumes the nodes at once."""

        def work(s: Session) -> int:
            result = s.execute(update(NodeLeaseRow)
                               .where(col(NodeLeaseRow.owner) == self.instance)
                               .values(owner=None, expires_at=None))
            s.execute(update(SingletonRow).where(col(SingletonRow.owner) == self.instance)
                      .values(owner=None, expires_at=None))
            s.execute(delete(InstanceRow).where(col(InstanceRow.id) == self.instance))
            s.commit()
            return int(result.rowcount)  # type: ignore[attr-defined]

        return await self._run(work)

    async def leases(self) -> builtins.list[LeaseInfo]:
        """Every held lease (owner set)."""

        def work(s: Session) -> builtins.list[LeaseInfo]:
            rows = s.exec(select(NodeLeaseRow).where(col(NodeLeaseRow.owner).is_not(None))
                          .order_by(col(NodeLeaseRow.node_id))).all()
            return [LeaseInfo(r.node_id, r.owner, r.fence, _aware(r.expires_at)) for r in rows]

        return await self._run(work)

    # -- instances and singletons -------------------------------------------------------------

    async def heartbeat(self, api_listen: str) -> None:
        def work(s: Session) -> None:
            row = s.get(InstanceRow, self.instance)
            if row is None:
                row = InstanceRow(id=self.instance, api_listen=api_listen)
            row.heartbeat_at = utcnow()
            s.add(row)
            s.commit()

        await self._run(work)

    async def instances(self) -> builtins.list[InstanceInfo]:
        """The live daemons (a heartbeat within one lease), with their leases."""

        def work(s: Session) -> builtins.list[InstanceInfo]:
            now = utcnow()
            horizon = now - timedelta(seconds=self.lease_s)
            rows = s.exec(select(InstanceRow).where(col(InstanceRow.heartbeat_at) > horizon)
                          .order_by(col(InstanceRow.id))).all()
            counts = dict(s.exec(select(NodeLeaseRow.owner, func.count())
                                 .where(col(NodeLeaseRow.expires_at) > now)
                                 .group_by(col(NodeLeaseRow.owner))).all())
            leaders: dict[str, list[str]] = {}
            for single in s.exec(select(SingletonRow)
                                 .where(col(SingletonRow.expires_at) > now)).all():
                if single.owner is not None:
                    leaders.setdefault(single.owner, []).append(single.name)
            return [InstanceInfo(r.id, r.api_listen, _aware(r.started_at) or now,
                                 _aware(r.heartbeat_at) or now, int(counts.get(r.id, 0)),
                                 tuple(sorted(leaders.get(r.id, ())))) for r in rows]

        return await self._run(work)

    async def lead(self, name: str) -> int | None:
        """Take or keep the lead of singleton ``name``: its fencing number while we lead,
        None while another live daemon does."""

        def work(s: Session) -> int | None:
            now = utcnow()
            # waits for another daemon's renewal in progress (never skips it: a skipped
            # row would read as "not ours" and drop a lead we hold)
            row = s.exec(select(SingletonRow).where(col(SingletonRow.name) == name)
                         .with_for_update()).first()
            if row is None:
                return self._first_row(s, SingletonRow(name=name, owner=self.instance, fence=1,
                                                       expires_at=self._expiry()))
            if not self._takeable(row, now):
                s.rollback()
                return None
            if row.owner != self.instance:
                row.owner, row.fence = self.instance, row.fence + 1
            row.expires_at = self._expiry()
            s.add(row)
            s.commit()
            return row.fence

        return await self._run(work)
