"""A fleet at rest costs reads, not writes (issue 29, bench/fleet_idle_bench.py): the periodic
duties over nodes where nothing changed write no row, and read the store once per sweep rather
than once per node. At a small size here, so the 10,000-node bench has nothing to find."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from provisioner.bmc.fake import fake_bmc_factory
from provisioner.config import BmcSettings, LifecycleSettings
from provisioner.domain import BmcEndpoint, NewNode
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.power import PowerSync
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports

NODES = 50
WRITES = ("INSERT", "UPDATE", "DELETE")


@contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    """Every SQL statement the store runs meanwhile."""
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement.lstrip())

    event.listen(store.engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", note)


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
    assert [s for s in seen if s.upper().startswith(WRITES)] == []
    # the nodes, their MACs and their credentials in one read, not a query per node
    assert len(seen) <= 3, seen

    await world.ensure("REST007", "power_off", "power", "off")  # the one that changed
    with statements(store) as seen:
        changed = await sync.sweep()
    assert changed.changed == 1
    assert 0 < len([s for s in seen if s.upper().startswith(WRITES)]) <= 3
