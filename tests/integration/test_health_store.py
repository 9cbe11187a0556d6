"""Health findings in the store, on SQLite and PostgreSQL: one row per (node, origin, class,
subject) whatever the rate, reopening, reconciling, silences; and ``HealthFindings`` writing
the node's history through the conductor and syncing a whole fleet's reports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from provisioner.config import LifecycleSettings
from provisioner.domain import NewNode, Node
from provisioner.errors import NotFound
from provisioner.health.model import Action, HealthClass
from provisioner.health.records import Change, FindingRecord, Origin, Report
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.findings import FindingFilter
from provisioner.store.store import Store
from tests.conftest import fake_ports

H, A = HealthClass, Action
XID79 = Report(H.GPU_LOST, A.RESTART_OS, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off "
               "the bus.", "0000:3b:00.0")
HOT = Report(H.THERMAL, A.DRAIN, "GPU 1 at 95 C", "GPU 1")


async def node(store: Store, name: str, state: NodeState = NodeState.ACTIVE) -> Node:
    return await store.nodes.create(NewNode(state=state, hostname=name), actor="test")


@pytest.fixture
async def health(any_store: Store, world: SimWorld) -> AsyncIterator[HealthFindings]:
    conductor = Conductor(any_store.nodes, fake_ports(world),
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))
    yield HealthFindings(any_store.findings, conductor)
    await conductor.stop()


async def test_repeats_update_one_row_at_any_rate(any_store: Store) -> None:
    gpu = await node(any_store, "gpu-001")
    first = await any_store.findings.observe(gpu.id, Origin.IN_BAND, XID79)
    # 200 repeats at once (several store threads on PostgreSQL): still one row
    repeats = await asyncio.gather(*(any_store.findings.observe(gpu.id, Origin.IN_BAND, XID79)
                                     for _ in range(200)))
    assert first.change is Change.OPENED
    assert {o.change for o in repeats} == {Change.SEEN}
    assert {o.record.id for o in repeats} == {first.record.id}
    found, total = await any_store.findings.list(FindingFilter(node_id=gpu.id))
    assert total == 1 and found[0].count == 201 and found[0].hostname == "gpu-001"
    assert found[0].first_seen == first.record.first_seen
    assert found[0].last_seen >= max(o.record.last_seen for o in repeats)
    # the same class from another origin, or about another subject, is another finding
    await any_store.findings.observe(gpu.id, Origin.ALERTMANAGER, XID79)
    await any_store.findings.observe(gpu.id, Origin.IN_BAND, Report(
        H.GPU_LOST, A.RESTART_OS, "XID 79", "0000:5d:00.0"))
    assert (await any_store.findings.list(FindingFilter()))[1] == 3


async def test_a_cleared_finding_that_returns_reopens(any_store: Store) -> None:
    gpu = await node(any_store, "gpu-001")
    opened = await any_store.findings.observe(gpu.id, Origin.SLURM, HOT)
    cleared = await any_store.findings.clear(gpu.id, Origin.SLURM, H.THERMAL, "GPU 1")
    assert cleared is not None and cleared.change is Change.CLEARED
    assert cleared.record.cleared_at is not None and not cleared.record.open
    assert await any_store.findings.clear(gpu.id, Origin.SLURM, H.THERMAL, "GPU 1") is None
    assert (await any_store.findings.list(FindingFilter()))[1] == 0  # open only
    again = await any_store.findings.observe(gpu.id, Origin.SLURM, HOT)
    assert again.change is Change.REOPENED and again.record.id == opened.record.id
    assert again.record.count == 1 and again.record.open
    assert again.record.first_seen > opened.record.first_seen


async def test_reconcile_clears_what_the_origin_no_longer_reports(any_store: Store) -> None:
    gpu = await node(any_store, "gpu-001")
    outcomes = await any_store.findings.reconcile(gpu.id, Origin.KUBERNETES, [XID79, HOT])
    assert [o.change for o in outcomes] == [Change.OPENED, Change.OPENED]
    await any_store.findings.observe(gpu.id, Origin.EXTERNAL, HOT)  # another origin: kept
    outcomes = await any_store.findings.reconcile(gpu.id, Origin.KUBERNETES, [HOT])
    assert [(o.change, o.record.cls) for o in outcomes] == [
        (Change.SEEN, H.THERMAL), (Change.CLEARED, H.GPU_LOST)]
    keys = await any_store.findings.open_keys(Origin.KUBERNETES)
    assert keys == {gpu.id: {("thermal", "GPU 1")}}
    # seen just now: a pass writes nothing (a fleet at rest is not rewritten every pass)
    assert await any_store.findings.touch(Origin.KUBERNETES) == 0
    assert await any_store.findings.touch(Origin.KUBERNETES, older_than=timedelta(0)) == 1


async def test_silence_a_class_now_and_for_findings_opened_meanwhile(any_store: Store) -> None:
    gpu = await node(any_store, "gpu-001")
    hot = await any_store.findings.observe(gpu.id, Origin.BMC, HOT)
    await any_store.findings.observe(gpu.id, Origin.IN_BAND, XID79)
    assert (await any_store.findings.open_counts())["thermal"] == 1
    until = datetime.now(UTC) + timedelta(hours=2)
    silenced = await any_store.findings.silence(gpu.id, until, reason="fan swap booked",
                                                actor="token:op", cls=H.THERMAL)
    assert [r.id for r in silenced] == [hot.record.id]
    later = await any_store.findings.observe(gpu.id, Origin.ALERTMANAGER, HOT)
    assert later.record.silenced(datetime.now(UTC))
    assert later.record.silence_reason == "fan swap booked"
    assert later.record.silenced_by == "token:op"
    counts = await any_store.findings.open_counts()
    assert counts["thermal"] == 0 and counts["gpu-lost"] == 1 and counts["leak"] == 0
    with pytest.raises(NotFound):
        await any_store.findings.silence(gpu.id, until, reason="x", actor="a", finding_id=999)


async def test_history_rows_and_listeners(any_store: Store, health: HealthFindings) -> None:
    gpu = await node(any_store, "gpu-001")
    heard: list[tuple[int, Change]] = []

    async def ladder(record: FindingRecord, change: Change) -> None:
        heard.append((record.id, change))

    health.add_listener(ladder)
    [opened] = await health.report(gpu.id, Origin.EXTERNAL, [XID79], actor="token:op")
    await health.report(gpu.id, Origin.EXTERNAL, [XID79], actor="token:op")  # seen: no row
    await health.resolve(gpu.id, Origin.EXTERNAL, H.GPU_LOST, "0000:3b:00.0", actor="token:op")
    await health.report(gpu.id, Origin.EXTERNAL, [XID79], actor="token:op")
    await health.silence(gpu.id, 3600, reason="vendor RMA open", actor="token:op",
                         finding_id=opened.record.id)
    history = (await any_store.nodes.history(gpu.id))[1:]
    rows = [(h.event, h.actor, h.reason.partition(":")[0]) for h in history[:3]]
    assert rows == [("health_finding", "token:op", "opened"),
                    ("health_cleared", "token:op", "cleared"),
                    ("health_finding", "token:op", "reopened")]
    assert history[3].event == "health_silenced" and len(history) == 4
    assert history[3].reason.startswith(f"finding {opened.record.id} silenced until 20")
    assert history[3].reason.endswith("(1 findings): vendor RMA open")
    assert "gpu-lost (restart_os) 0000:3b:00.0 from external: NVRM: Xid" in \
        (await any_store.nodes.history(gpu.id))[1].reason
    assert heard == [(opened.record.id, Change.OPENED), (opened.record.id, Change.CLEARED),
                     (opened.record.id, Change.REOPENED)]
    assert (await any_store.nodes.get(gpu.id)).state is NodeState.ACTIVE


async def test_fleet_sync_writes_changes_only(any_store: Store, health: HealthFindings) -> None:
    a = await node(any_store, "gpu-001")
    b = await node(any_store, "gpu-002")
    deploying = await node(any_store, "gpu-003", NodeState.DEPLOYING)
    # left open by an earlier leader: cleared by this daemon's first pass
    await any_store.findings.observe(b.id, Origin.SLURM, HOT)
    down = Report(H.UNRESPONSIVE, A.RESTART_OS, "Slurm: node DOWN+NOT_RESPONDING", "slurmd")
    fleet = {"gpu-001": [down], "gpu-002": [], "gpu-003": [down], "not-ours": [down]}
    assert await health.sync(Origin.SLURM, fleet) == 2  # a opened, b cleared; c not observed
    assert await any_store.findings.open_keys(Origin.SLURM) == {a.id: {("unresponsive",
                                                                         "slurmd")}}
    before = len(await any_store.nodes.history(a.id))
    assert await health.sync(Origin.SLURM, fleet) == 0  # nothing changed: nothing written
    assert len(await any_store.nodes.history(a.id)) == before
    assert await health.sync(Origin.SLURM, {"gpu-001": [], "gpu-002": [down]}) == 2
    assert await any_store.findings.open_keys(Origin.SLURM) == {b.id: {("unresponsive",
                                                                         "slurmd")}}
    assert (await any_store.findings.list(FindingFilter(node_id=deploying.id)))[1] == 0
