"""The fleet's history as an audit trail: rows of every node filtered by time, actor, event and
node, paged by their fleet-wide id (``GET /api/v1/history``, ``provisioner audit``); and the
retention that prunes rows older than ``store.history_retention_days``, never a node's last
row (what it is now, and why, stays readable however old)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection, delete, or_
from sqlalchemy import select as sa_select

from provisioner.domain import FleetEvent, HistoryEntry
from provisioner.ids import NodeId
from provisioner.store.models import NodeRow, TransitionRow

PRUNE_BATCH: Final = 5000


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """History rows matching every field given; ``actor`` ending in ``*`` is a prefix."""

    since: datetime | None = None
    until: datetime | None = None
    actor: str | None = None
    events: tuple[str, ...] = ()
    node: str | None = None  # id or hostname
    after: int | None = None  # the cursor: rows past this id, in the order asked
    oldest_first: bool = False
    limit: int = 100


def audit(conn: Connection, query: AuditQuery) -> list[FleetEvent]:
    t = TransitionRow.__table__.c  # type: ignore[attr-defined]
    n = NodeRow.__table__.c  # type: ignore[attr-defined]
    conditions: list[Any] = []
    if query.since is not None:
        conditions.append(t.created_at >= query.since)
    if query.until is not None:
        conditions.append(t.created_at < query.until)
    if query.actor:
        if query.actor.endswith("*"):
            prefix = query.actor[:-1].replace("\\", "\\\\").replace("%", "\\%").replace(
                "_", "\\_")
            conditions.append(t.actor.like(prefix + "%", escape="\\"))
        else:
            conditions.append(t.actor == query.actor)
    if query.events:
        conditions.append(t.event.in_(list(query.events)))
    if query.node is not None:
        conditions.append(or_(n.id == query.node, n.hostname == query.node))
    if query.after is not None:
        conditions.append(t.id > query.after if query.oldest_first else t.id < query.after)
    select = sa_select(t.id, t.node_id, t.seq, t.event, t.from_state, t.to_state, t.actor,
                       t.reason, t.created_at, t.instance, t.fence, n.hostname,
                       n.maintenance, n.maintenance_reason, n.last_error
                       ).join_from(TransitionRow.__table__,  # type: ignore[attr-defined]
                                   NodeRow.__table__,  # type: ignore[attr-defined]
                                   n.id == t.node_id)
    rows = conn.execute(select.where(*conditions)
                        .order_by(t.id if query.oldest_first else t.id.desc())
                        .limit(query.limit)).all()
    return with_former_hostnames(conn, [FleetEvent(int(r.id), HistoryEntry(
        node_id=NodeId(r.node_id), seq=r.seq, event=r.event, from_state=r.from_state,
        to_state=r.to_state, actor=r.actor, reason=r.reason, at=r.created_at,
        instance=r.instance, fence=r.fence), r.hostname, bool(r.maintenance),
        r.maintenance_reason or "", r.last_error or "") for r in rows])


def with_former_hostnames(conn: Connection, events: list[FleetEvent]) -> list[FleetEvent]:
    """``events`` with a replaced chassis's rows named by the hostname it had: a retired node
    that a replacement took the name of has none now, and keeps the old one in its facts
    (``replaced_by.hostname``, store/node_admin.py). Only retired nodes without a hostname
    are read again (their facts); every other row keeps the node's hostname now."""
    nameless = {e.entry.node_id for e in events if e.hostname is None}
    if not nameless:
        return events
    n = NodeRow.__table__.c  # type: ignore[attr-defined]
    former: dict[str, str] = {}
    for node_id, facts in conn.execute(sa_select(n.id, n.facts).where(
            n.id.in_(sorted(nameless)), n.hostname.is_(None), n.state == "retired")).all():
        try:
            replaced = json.loads(facts or "{}").get("replaced_by")
        except (ValueError, AttributeError):
            continue
        name = replaced.get("hostname") if isinstance(replaced, dict) else None
        if isinstance(name, str) and name:
            former[node_id] = name
    if not former:
        return events
    return [replace(e, hostname=former[e.entry.node_id]) if e.hostname is None
            and e.entry.node_id in former else e for e in events]


def prune_batch(conn: Connection, before: datetime, batch: int = PRUNE_BATCH) -> int:
    """Delete up to ``batch`` rows written before ``before`` that are not their node's last
    row; how many went (the caller commits, and calls again while it is ``batch``)."""
    t = TransitionRow.__table__  # type: ignore[attr-defined]
    newer = t.alias("newer")
    has_later = (sa_select(newer.c.id)
                 .where(newer.c.node_id == t.c.node_id, newer.c.seq > t.c.seq).exists())
    doomed = (sa_select(t.c.id).where(t.c.created_at < before, has_later)
              .order_by(t.c.id).limit(batch))
    ids: Sequence[int] = [row[0] for row in conn.execute(doomed).all()]
    if not ids:
        return 0
    conn.execute(delete(t).where(t.c.id.in_(list(ids))))
    return len(ids)
