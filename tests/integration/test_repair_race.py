"""Two daemons on one database hear of the same node's fault at once, from two origins (an
Alertmanager alert posted to one, the BMC poll or the in-band probe of the other): both
findings are stored, one ladder runs, and the repair record an operator hands to the vendor
holds the evidence of both. On SQLite (one daemon: two intakes on one store) and on a real
PostgreSQL with two stores, each its own daemon instance with its own leases."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from provisioner.config import LifecycleSettings, Settings
from provisioner.config.health import HealthSettings
from provisioner.domain import BmcEndpoint, NewNode, Node
from provisioner.health.model import Action, Finding, HealthClass
from provisioner.health.record import RepairRecord
from provisioner.health.records import Origin, Report
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.repair import RepairService, ladder_listener
from provisioner.lifecycle.states import Event, NodeState
from provisioner.simulation.drivers import simulated_facts
from provisioner.simulation.world import SimWorld
from provisioner.store.findings import FindingFilter
from provisioner.store.repo import NodeRepo
from provisioner.store.store import open_store
from tests.conftest import fake_ports
from tests.integration.test_repair_ladder import effects

S = NodeState
NODES = 6
MANUAL = LifecycleSettings(auto_inspect=False, auto_deploy=False)
XID79 = Report(HealthClass.GPU_LOST, Action.RESET_GPU,
               "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off "
               "the bus.", "0000:18:00")
LEAK = Report(HealthClass.LEAK, Action.DRAIN,
              "LeakDetection: Chassis/1/ThermalSubsystem/LeakDetection/LeakDetectors/0 "
              "DetectorState Critical", "tray 1")
FINDING = Finding(XID79.cls, XID79.action, XID79.evidence, str(Origin.IN_BAND), XID79.subject)
ALERT = Report(HealthClass.GPU_LOST, Action.RESET_GPU,
               "alertname=GPUFellOffTheBus gpu=0 DCGM_FI_DEV_XID_ERRORS=79", "0000:18:00")


@dataclass
class Daemon:
    repo: NodeRepo
    conductor: Conductor
    repairs: RepairService
    health: HealthFindings


@pytest.fixture
async def daemons(backend_settings: Settings,
                  world: SimWorld) -> AsyncIterator[tuple[Daemon, Daemon]]:
    """Two intakes with their own conductor and repair service: on PostgreSQL two daemon
    instances (own store, own leases); on SQLite (one daemon by design) one store. The
    machines answer slowly (0.3 s a call): the ladder is still on its drain when both
    findings are decided, as it is on real hardware."""
    postgres = backend_settings.database_url is not None
    stores = [open_store(backend_settings, instance=name) for name in
              (("A", "B") if postgres else ("A",))]
    made: list[Daemon] = []
    for n in range(2):
        store = stores[n % len(stores)]
        conductor = Conductor(store.nodes, fake_ports(world, delay_s=0.3), MANUAL,
                              ownership=store.ownership if postgres else None)
        repairs = RepairService(conductor, store.nodes,
                                HealthSettings(max_repairing_fraction=1.0,
                                               max_repairing_fraction_rack=1.0),
                                breakers=store.findings)
        health = HealthFindings(store.findings, conductor)
        health.add_listener(ladder_listener(repairs))
        made.append(Daemon(store.nodes, conductor, repairs, health))
    yield made[0], made[1]
    for daemon in made:
        await daemon.conductor.stop()
    for store in stores:
        store.close()


async def _active(daemon: Daemon, world: SimWorld, n: int) -> Node:
    serial = f"RACE{n:03d}"
    repo = daemon.repo
    node = await repo.create(NewNode(
        state=S.ACTIVE, hostname=f"race-{n:03d}", serial=serial, profile="gpu",
        macs=(f"52:54:00:bb:00:{n:02x}",), bmc=BmcEndpoint(driver="fake", address=serial),
        bmc_password="pw"), actor="test")
    node = await repo.merge_facts(node.id, simulated_facts(serial, serial))
    await world.ensure(serial, "boot", "power", "on")
    return node


async def _ended(daemon: Daemon, node_id: str) -> Node:
    async with asyncio.timeout(30):
        while True:
            node = await daemon.repo.get(node_id)
            record = RepairRecord.from_facts(node.facts)
            if node.state in (S.ACTIVE, S.SERVICE_REQUIRED) and record is not None \
                    and not record.open_now:
                return node
            await asyncio.sleep(0.05)


@pytest.mark.parametrize(("first", "second"), [(Origin.ALERTMANAGER, Origin.IN_BAND),
                                               (Origin.BMC, Origin.IN_BAND)])
async def test_two_origins_at_once_one_ladder_and_all_evidence(
        daemons: tuple[Daemon, Daemon], world: SimWorld, first: Origin,
        second: Origin) -> None:
    a, b = daemons
    one = ALERT if first is Origin.ALERTMANAGER else LEAK
    nodes = [await _active(a, world, n) for n in range(NODES)]
    await asyncio.gather(*(
        call for node in nodes for call in (
            a.health.report(node.id, first, [one], actor=f"test:{first}"),
            b.health.report(node.id, second, [XID79], actor=f"test:{second}"))))
    for node in nodes:
        ended = await _ended(a, node.id)
        record = RepairRecord.from_facts(ended.facts)
        assert record is not None
        # the evidence of both findings reached the record the vendor gets
        assert set(record.evidence) == {one.evidence, XID79.evidence}, (node.id, record)
        # both findings are stored, each from its origin
        found, total = await a.health.repo.list(FindingFilter(node_id=node.id))
        assert total == 2 and {f.origin for f in found} == {first, second}
        # one ladder: one transition into repairing, one drain
        history = await a.repo.history(node.id)
        assert [h.event for h in history].count(str(Event.REPAIR)) == 1, history
        assert effects(world, node.serial or "")["slurm_drain"] == 1


async def test_two_daemons_holding_findings_at_once_keep_every_hold(
        daemons: tuple[Daemon, Daemon], world: SimWorld) -> None:
    """The breaker is open; both daemons hold findings at once: the breaker keeps every
    node it held (each daemon's change applied to the breaker as stored, under its lock),
    and the operator's reset names them all."""
    a, b = daemons
    store = a.health.repo
    await store.change_breaker(lambda _stored: ("a bad driver rollout", "2026-11-27", {}))
    nodes = [await _active(a, world, n) for n in range(NODES)]
    decisions = await asyncio.gather(*(
        (a if n % 2 else b).repairs.open(node.id, FINDING)
        for n, node in enumerate(nodes)))
    assert {d.outcome for d in decisions} == {"breaker"}
    stored = await store.load_breaker()
    assert stored is not None and set(stored[2]) == {node.id for node in nodes}
    state = await b.repairs.reset_breaker(actor="op", reason="rollback done")
    assert not state.tripped and await store.load_breaker() is None
    for node in nodes:
        history = await a.repo.history(node.id)
        assert [h.event for h in history].count("repair_breaker_reset") == 1
    # a finding after the reset starts its ladder: the breaker stays closed
    again = await a.repairs.open(nodes[0].id, FINDING)
    assert again.started and await store.load_breaker() is None
