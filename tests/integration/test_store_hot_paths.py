"""The store calls a node's lifecycle makes ~55 times per node (a read, a checkpoint, a
fenced transition, a facts merge): what each costs must not grow with the fleet, and their
group commits (``TxnBatcher(shared=True)``, on SQLite and on PostgreSQL) must behave as one
call each would.

The cost is counted, not timed: the statements each call runs, and SQLite's virtual-machine
instructions for them (its progress handler), with 20 and then 400 nodes in the store. A
query that scans every node (a missing index, a filter on an unindexed column) grows with
the fleet; a lookup by key does not."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event

from provisioner.domain import NewNode, Node
from provisioner.errors import Fenced, NodeBusy
from provisioner.lifecycle.states import NodeState
from provisioner.store.batch import TxnBatcher
from provisioner.store.store import Store

S = NodeState
STEP = 10  # the progress handler's granularity: one call per this many instructions


def new(n: int) -> NewNode:
    return NewNode(state=S.ENROLLED, hostname=f"gpu-{n:04d}", serial=f"SN{n:05d}",
                   macs=(f"52:54:00:aa:{n >> 8:02x}:{n & 0xff:02x}",), rack=f"r{n % 10}")


class Meter:
    """Statements run and SQLite VM instructions (in STEPs) on an engine, while ``on``."""

    def __init__(self, engine: Engine) -> None:
        self.on = False
        self.statements: list[str] = []
        self.steps = 0
        event.listen(engine, "before_cursor_execute", self._before)

    def _tick(self) -> int:
        self.steps += 1
        return 0  # go on

    def _before(self, conn: Connection, _cursor: Any, statement: str, *_: Any) -> None:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        raw.set_progress_handler(self._tick if self.on else None, STEP)  # type: ignore[attr-defined]
        if self.on:
            self.statements.append(statement)


async def lifecycle_calls(store: Store, node: Node) -> Node:
    """One of each hot call, as a step runs them: read, claim, checkpoints, a merge of
    facts, a fenced transition that releases the lease."""
    fence = await store.ownership.claim(node.id)
    node = await store.nodes.get(node.id)
    node = await store.nodes.save_checkpoint(node, ["pxe"], fence=fence)
    node = await store.nodes.save_checkpoint(node, ["pxe", "on"], power_state="on", fence=fence)
    node = await store.nodes.merge_facts(node.id, {"cpu": {"cores": 64}})
    return await store.nodes.transition(node, to_state=S.INSPECTING, event="inspect",
                                         actor="test", fence=fence, release=True)


async def metered(store: Store, meter: Meter, node: Node) -> tuple[list[str], int]:
    meter.statements, meter.steps, meter.on = [], 0, True
    try:
        await lifecycle_calls(store, node)
    finally:
        meter.on = False
    return meter.statements, meter.steps


async def test_a_nodes_calls_cost_the_same_in_a_larger_fleet(store: Store) -> None:
    meter = Meter(store.engine)
    small = [await store.nodes.create(new(n), actor="test") for n in range(20)]
    await lifecycle_calls(store, small[0])  # warm: statement caches, the first lease rows
    statements_small, steps_small = await metered(store, meter, small[1])
    for n in range(20, 400):
        await store.nodes.create(new(n), actor="test")
    statements_large, steps_large = await metered(store, meter, small[2])
    assert statements_large == statements_small  # no query more per node in a larger fleet
    # a scan of every node would cost 20x more here; a lookup by key grows with log(n)
    assert steps_large <= steps_small * 1.3, (steps_small, steps_large)
    plans: list[str] = []
    with store.engine.connect() as conn:
        for statement in sorted(set(statements_large)):
            plans += [row[3] for row in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN " + statement, (None,) * statement.count("?"))]
    # every table reached through an index (SEARCH ... USING), none read whole (SCAN)
    assert plans and not [plan for plan in plans if plan.startswith("SCAN")], plans


# -- group commits (SQLite, and PostgreSQL since issue 29) ---------------------------------


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    workers = ThreadPoolExecutor(max_workers=1)
    yield workers
    workers.shutdown(wait=True)


def _now() -> datetime:
    return datetime.now(UTC)


async def test_a_shared_batcher_lets_the_pools_other_calls_run_between_batches(
        store: Store, pool: ThreadPoolExecutor) -> None:
    loop = asyncio.get_running_loop()
    order: list[str] = []
    gate = threading.Event()
    for shared, expected in ((True, ["a", "x", "b"]), (False, ["a", "b", "x"])):
        order.clear()
        gate.clear()
        blocker = loop.run_in_executor(pool, gate.wait)  # the pool busy while we queue
        batcher = TxnBatcher(store.engine, pool, _now, max_batch=1, shared=shared)
        first = asyncio.ensure_future(batcher.run(lambda _c, _t: order.append("a")))
        await asyncio.sleep(0)  # queued: the drain is in the pool behind the blocker
        other = loop.run_in_executor(pool, order.append, "x")
        second = asyncio.ensure_future(batcher.run(lambda _c, _t: order.append("b")))
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(blocker, first, other, second)
        assert order == expected, shared


async def test_a_shared_batcher_never_runs_a_call_whose_caller_gave_up(
        store: Store, pool: ThreadPoolExecutor) -> None:
    loop = asyncio.get_running_loop()
    ran: list[str] = []
    gate = threading.Event()
    blocker = loop.run_in_executor(pool, gate.wait)
    batcher = TxnBatcher(store.engine, pool, _now, shared=True)
    given_up = asyncio.ensure_future(batcher.run(lambda _c, _t: ran.append("given up")))
    kept = asyncio.ensure_future(batcher.run(lambda _c, _t: ran.append("kept")))
    await asyncio.sleep(0)
    given_up.cancel()
    gate.set()
    await blocker
    assert await kept is None
    assert ran == ["kept"]


async def test_hot_calls_waiting_together_share_a_transaction(any_store: Store) -> None:
    """On SQLite and on PostgreSQL (since issue 29's 10,000-node fleet: a node's calls were
    three round trips each there, and a pool hop each)."""
    store = any_store
    nodes = [await store.nodes.create(new(n), actor="test") for n in range(40)]
    fences = {node.id: await store.ownership.claim(node.id) for node in nodes}
    commits = 0

    def committed(_conn: Connection) -> None:
        nonlocal commits
        commits += 1

    event.listen(store.engine, "commit", committed)
    try:
        written = await asyncio.gather(*(
            store.nodes.save_checkpoint(node, ["pxe"], fence=fences[node.id])
            for node in nodes))
    finally:
        event.remove(store.engine, "commit", committed)
    assert all(n.checkpoint == ("pxe",) for n in written)
    assert 1 <= commits <= len(nodes) // 4, commits  # one a call: 40
    assert [(await store.nodes.get(n.id)).checkpoint for n in nodes] == [("pxe",)] * 40


async def test_group_committed_writes_fail_alone(any_store: Store) -> None:
    """Checkpoints and transitions of many nodes at once (one or a few group commits): a
    write that loses its race (NodeBusy) or its lease (Fenced) fails alone, every other
    one is stored, and each sees exactly what it would have seen on its own (SQLite and
    PostgreSQL: on PostgreSQL a failed statement aborts the whole transaction, which the
    batch then runs again one call a transaction)."""
    store = any_store
    nodes = [await store.nodes.create(new(n), actor="test") for n in range(40)]
    fences = {node.id: await store.ownership.claim(node.id) for node in nodes}
    stale = await store.nodes.transition(nodes[7], to_state=S.INSPECTING, event="inspect",
                                         actor="test")  # nodes[7] as held below is stale
    assert stale.version == nodes[7].version + 1
    lost = nodes[9]
    assert await store.ownership.claim(lost.id, force=True) == fences[lost.id] + 1

    async def write(i: int, node: Node) -> Node:
        if i % 2:
            return await store.nodes.save_checkpoint(node, [f"sub-{i}"], fence=fences[node.id])
        return await store.nodes.transition(node, to_state=S.INSPECTING, event="inspect",
                                            actor="test", fence=fences[node.id])

    outcomes = await asyncio.gather(*(write(i, n) for i, n in enumerate(nodes)),
                                    return_exceptions=True)
    assert isinstance(outcomes[9], Fenced)
    failed = {i: type(o) for i, o in enumerate(outcomes) if isinstance(o, BaseException)}
    # nodes[7]: its transition's CAS on the old version loses
    assert failed == {7: NodeBusy, 9: Fenced}
    for i, node in enumerate(nodes):
        if i in failed:
            continue
        stored, written = await store.nodes.get(node.id), outcomes[i]
        assert isinstance(written, Node)
        assert (stored.state, stored.version, stored.checkpoint) == (
            written.state, written.version, written.checkpoint)
        if i % 2:
            assert stored.checkpoint == (f"sub-{i}",) and stored.state is S.ENROLLED
        else:
            assert stored.state is S.INSPECTING and stored.version == node.version + 1
    history = await store.nodes.history(nodes[9].id)
    assert [h.event for h in history] == ["enroll"]  # the fenced write left nothing
