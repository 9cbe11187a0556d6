"""The fleet's audit trail (``store.history``: ``NodeReads.audit``) and its retention
(``HistoryRetention``: rows older than ``store.history_retention_days`` are pruned, never a
node's last row), against real SQLite and a real PostgreSQL server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.sweeps import HistoryRetention
from provisioner.store.history import AuditQuery
from provisioner.store.store import Store
from tests.integration.test_store import new

S = NodeState
NOW = datetime.now(UTC)


async def _age(store: Store, node_id: str, seq: int, days: int) -> None:
    """Back-date one history row by ``days``."""
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE transition SET created_at = :at WHERE node_id = :n AND "
                          "seq = :seq"), {"at": NOW - timedelta(days=days), "n": node_id,
                                          "seq": seq})


async def _fleet(store: Store) -> tuple[str, str]:
    """gpu-001: enroll (alice), inspect (bob), maintenance (token:carol); gpu-002: enroll."""
    repo = store.nodes
    one = await repo.create(new(1), actor="alice")
    one = await repo.transition(one, to_state=S.INSPECTING, event="inspect", actor="bob",
                                reason="go")
    await repo.transition(one, to_state=S.INSPECTING, event="maintenance_on",
                          actor="token:carol", reason="RMA 7")
    two = await repo.create(new(2), actor="token:dave")
    return one.id, two.id


async def test_audit_filters_and_pages_newest_first_or_oldest(any_store: Store) -> None:
    one, two = await _fleet(any_store)
    repo = any_store.nodes
    everything = await repo.audit(AuditQuery())
    assert [(e.hostname, e.entry.event) for e in everything] == [
        ("gpu-002", "enroll"), ("gpu-001", "maintenance_on"), ("gpu-001", "inspect"),
        ("gpu-001", "enroll")]
    ids = [e.id for e in everything]
    assert ids == sorted(ids, reverse=True)
    tokens = await repo.audit(AuditQuery(actor="token:*"))
    assert [e.entry.actor for e in tokens] == ["token:dave", "token:carol"]
    assert [e.entry.actor for e in await repo.audit(AuditQuery(actor="bob"))] == ["bob"]
    assert await repo.audit(AuditQuery(actor="token%")) == []  # a LIKE wildcard is literal
    assert [e.entry.event for e in await repo.audit(AuditQuery(
        events=("inspect", "maintenance_on")))] == ["maintenance_on", "inspect"]
    assert {e.entry.node_id for e in await repo.audit(AuditQuery(node="gpu-002"))} == {two}
    assert len(await repo.audit(AuditQuery(node=one))) == 3
    # pages: newest first past a cursor, or oldest first (resume)
    first = await repo.audit(AuditQuery(limit=2))
    rest = await repo.audit(AuditQuery(limit=2, after=first[-1].id))
    assert [e.id for e in first + rest] == ids
    assert [e.id for e in await repo.audit(AuditQuery(oldest_first=True, after=ids[-1]))] \
        == ids[::-1][1:]
    # time: back-date gpu-001's enrolment by 10 days
    await _age(any_store, one, 1, 10)
    old = await repo.audit(AuditQuery(until=NOW - timedelta(days=1)))
    assert [(e.hostname, e.entry.event) for e in old] == [("gpu-001", "enroll")]
    recent = await repo.audit(AuditQuery(since=NOW - timedelta(days=1)))
    assert len(recent) == 3 and all(e.entry.at >= NOW - timedelta(days=1) for e in recent)


async def test_retention_prunes_old_rows_but_never_a_nodes_last(any_store: Store) -> None:
    one, two = await _fleet(any_store)
    for seq in (1, 2, 3):
        await _age(any_store, one, seq, 500)
    await _age(any_store, two, 1, 500)  # gpu-002's only row: old, and kept
    forever = HistoryRetention(any_store.nodes, days=0)
    assert await forever.prune() == 0
    assert len(await any_store.nodes.audit(AuditQuery())) == 4
    retention = HistoryRetention(any_store.nodes, days=400)
    assert await retention.prune() == 2
    left = {(e.entry.node_id, e.entry.seq) for e in await any_store.nodes.audit(AuditQuery())}
    assert left == {(one, 3), (two, 1)}
    assert [h.event for h in await any_store.nodes.history(one)] == ["maintenance_on"]
    assert await retention.prune() == 0
    # a row within the retention is kept whatever its rank
    node = await any_store.nodes.get(one)
    await any_store.nodes.transition(node, to_state=S.INSPECTED, event="done",
                                     actor="conductor")
    await _age(any_store, one, 3, 10)
    assert await retention.prune() == 0
