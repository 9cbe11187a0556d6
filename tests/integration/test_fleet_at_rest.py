"""A fleet at rest costs reads, not writes (issue 29, bench/fleet_idle_bench.py): the periodic
duties over nodes where nothing changed write no row, and read the store once per sweep rather
than once per node. At a small size here, so the 10,000-node bench has nothing to find."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import event

from provisioner.bmc.fake import fake_bmc_factory
from provisioner.config import BmcSettings, LifecycleSettings
from provisioner.domain import BmcEndpoint, NewNode
from provisioner.health.model import Action, HealthClass
from provisioner.health.records import Origin, Report
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.power import PowerSync
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld, read_ledger
from provisioner.store.store import Store
from tests.conftest import fake_ports

NODES = 50
WRITES = ("INSERT", "UPDATE", "DELETE")


@dataclass
class Seen:
    statements: list[str] = field(default_factory=list)
    rows_written: int = 0  # rows inserted, updated or deleted


@contextmanager
def statements(store: Store) -> Iterator[Seen]:
    """Every SQL statement the store runs meanwhile, and the rows they wrote."""
    seen = Seen()

    def note(_conn: Any, cursor: Any, statement: str, *_args: Any) -> None:
        seen.statements.append(statement.lstrip())
        if statement.lstrip().upper().startswith(WRITES):
            seen.rows_written += max(0, cursor.rowcount)

    event.listen(store.engine, "after_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(store.engine, "after_cursor_execute", note)


async def active_fleet(store: Store, world: SimWorld) -> list[str]:
    ids = []
    for i in range(NODES):
        key = f"REST{i:03d}"
        node = await store.nodes.create(NewNode(
            state=NodeState.ACTIVE, serial=key, hostname=f"rest-{i:03d}",
            bmc=BmcEndpoint(driver="fake", address=key, username="admin", password_set=True),
            bmc_password=f"pw-{i}"), actor="test")
        await world.ensure(key, "power_on", "power", "on")
        ids.append(node.id)
    return ids


async def test_a_power_sweep_over_unchanged_nodes_writes_nothing_and_reads_once(
        store: Store, world: SimWorld) -> None:
    ids = await active_fleet(store, world)
    conductor = Conductor(store.nodes, fake_ports(world),
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))
    sync = PowerSync(store.nodes, fake_bmc_factory(world), conductor.record_power,
                     BmcSettings())
    first = await sync.sweep()  # the first readings are stored (no history row)
    assert (first.read, first.failed, first.skipped) == (NODES, 0, 0)
    assert {(await store.nodes.get(node_id)).power_state for node_id in ids} == {"on"}

    with statements(store) as seen:
        again = await sync.sweep()
    assert (again.read, again.changed, again.failed) == (NODES, 0, 0)
    assert seen.rows_written == 0, seen
    # the nodes and their credentials in one read, not a query per node; not their facts
    # (parsing every node's facts every period is most of what a sweep costs)
    assert len(seen.statements) == 1, seen
    assert "facts" not in seen.statements[0]

    await world.ensure("REST007", "power_off", "power", "off")  # the one that changed
    with statements(store) as seen:
        changed = await sync.sweep()
    assert changed.changed == 1
    assert seen.rows_written == 2  # the node's power state and one history row


async def test_a_sync_pass_that_sees_the_same_findings_writes_nothing(
        store: Store, world: SimWorld) -> None:
    """Slurm and Kubernetes hand every node's reports to ``HealthFindings.sync`` every pass
    (30 s): nodes with an open finding that did not change are not rewritten."""
    await active_fleet(store, world)
    conductor = Conductor(store.nodes, fake_ports(world),
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))
    health = HealthFindings(store.findings, conductor)
    down = Report(HealthClass.UNRESPONSIVE, Action.RESTART_OS,
                  "Slurm: node DOWN: Not responding", "slurmd")
    passes = {f"rest-{i:03d}": [down] if i % 5 == 0 else [] for i in range(NODES)}
    assert await health.sync(Origin.SLURM, passes) == NODES // 5  # opened, with history
    with statements(store) as seen:
        assert await health.sync(Origin.SLURM, passes) == 0
    assert seen.rows_written == 0, seen
    assert len(seen.statements) <= 2, seen

    await conductor.stop()


async def test_the_simulated_machines_count_reads_for_the_bench(tmp_path: Path) -> None:
    """bench/fleet_idle_bench.py reports BMC calls per node from the world's ``reads`` (written
    at close: a read changes nothing) and its ledger (the writes)."""
    world = SimWorld(tmp_path / "world.sqlite")
    for _ in range(3):
        assert await world.get("M1", "power") == "off"
    await world.ensure("M1", "power_on", "power", "on")
    world.close()
    with closing(sqlite3.connect(tmp_path / "world.sqlite")) as db:
        assert db.execute("SELECT key, attr, calls FROM reads").fetchall() == [("M1", "power", 3)]
    assert read_ledger(tmp_path / "world.sqlite") == {("M1", "power_on"): (1, 1)}
