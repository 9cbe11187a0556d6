"""NVLink domains and the repair ladder (``lifecycle/repair_domains.py``), read from the
published ``topology.conf`` text: a GB200 tray whose ladder ends in ``service_required`` leaves
its domain's block (the block shrinks; a profile with ``hold_domain_on_repair`` holds the
whole domain); repaired, it stays out until its domain's acceptance passed after the repair,
and its return asks for that run."""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from provisioner.config import (
    AcceptanceProfile,
    LifecycleSettings,
    TopologySettings,
    ValidationProfile,
    ValidationSettings,
)
from provisioner.config.health import HealthSettings
from provisioner.domain import BmcEndpoint, Node
from provisioner.health.model import Action, Finding, HealthClass, Source
from provisioner.lifecycle.acceptance import DomainAcceptance
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.repair import RepairService
from provisioner.lifecycle.repair_domains import RepairHolds, RepairRejoin, combine
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.drivers import CLIQUE, FAULT, simulated_facts
from provisioner.simulation.world import SimWorld
from provisioner.store.acceptance import PASSED
from provisioner.store.store import Store
from provisioner.topology_live.live import LiveTopology
from provisioner.topology_live.publish_file import FilePublisher
from provisioner.validation.record import ValidationRecord
from tests.conftest import fake_ports, wait_for_state
from tests.integration.test_fabric_reaccept import NotLaunched
from tests.topology_support import nvsmi

S = NodeState
XID79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus."
LOST = Finding(HealthClass.GPU_LOST, Action.RESET_GPU, XID79, Source.KERNEL_LOG, "0000:18:00")


def validation(*, whole: bool) -> ValidationSettings:
    return ValidationSettings(profiles={"gb200": ValidationProfile(
        nvlink_domain=True, hold_domain_on_repair=whole,
        acceptance=AcceptanceProfile(fabric_class="gb200-nvl72"))})


async def trays(store: Store, world: SimWorld, make_node: Any, prefix: str, clique: str,
                count: int, first: int) -> list[Node]:
    """GB200 trays of one NVLink domain, active, as their validating step left them."""
    nodes = []
    for i in range(first, first + count):
        serial = f"{prefix.upper()}{i}"
        node = await make_node(S.ACTIVE, hostname=f"{prefix}-{i:02d}", serial=serial,
                               profile="gb200", bmc=BmcEndpoint(driver="fake", address=serial),
                               bmc_password="pw")
        facts = simulated_facts(serial, serial) | {"last_report": {
            "nvidia_smi_xml": nvsmi.xml(nvsmi.gpus(i, count=4, clique=clique))}}
        record = ValidationRecord(passed=True, at="2026-11-27T00:00:00+00:00",
                                  clique=f"{nvsmi.CLUSTER_A}.{clique}", domain_nodes=count)
        await store.nodes.merge_facts(node.id, facts | {"validation": record.to_facts()})
        await world.ensure(serial, "boot", "power", "on")
        await world.ensure(serial, "clique", CLIQUE, f"{nvsmi.CLUSTER_A}.{clique}")
        nodes.append(await store.nodes.get(node.id))
    return nodes


def blocks(path: Path) -> dict[str, str]:
    """{block name: nodes} of the published topology.conf."""
    return dict(re.findall(r"^BlockName=(\S+) Nodes=(\S+)$", path.read_text(), re.M))


async def passed_run(store: Store, domain: str, nodes: list[Node]) -> None:
    run_id = uuid.uuid4().hex
    await store.acceptance.start(run_id, domain, "gb200-nvl72",
                                 [(n.id, n.hostname or "") for n in nodes],
                                 deadline_at=datetime.now(UTC) + timedelta(hours=1),
                                 requested_by="test", instance=None)
    await store.acceptance.finish(run_id, PASSED, summary="passed", slowest=None, result={})


async def test_a_failed_tray_shrinks_its_block_and_rejoins_after_its_domain_passed(
        store: Store, world: SimWorld, make_node: Any, tmp_path: Path) -> None:
    settings = validation(whole=False)
    domain_a = await trays(store, world, make_node, "nvl", "1", 4, 1)
    await trays(store, world, make_node, "nvl", "2", 2, 5)
    acceptance = DomainAcceptance(store.nodes, store.acceptance, NotLaunched(), settings)
    path = tmp_path / "topology.conf"
    topology = LiveTopology(store.topology, TopologySettings(format="block"),
                            [FilePublisher(path)])
    holds = RepairHolds(store.nodes, settings, last_passes=acceptance.last_passes)
    topology.hold_with(combine(acceptance.held_nodes, holds.held))
    asked: list[str] = []
    heard = asyncio.Event()

    async def ask(node: Node) -> str:
        asked.append(node.hostname or "")
        heard.set()
        return "asked"

    rejoin = RepairRejoin(settings, ask)
    conductor = Conductor(store.nodes, fake_ports(world),
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))
    conductor.add_observer(rejoin.observe)
    repairs = RepairService(conductor, store.nodes, HealthSettings(max_repairing_fraction=1.0))
    try:
        await topology.refresh()
        before = blocks(path)
        assert sorted(before.values()) == ["nvl-[01-04]", "nvl-[05-06]"], before

        tray = domain_a[1]
        await world.ensure(tray.serial or "", "inject", FAULT, "never")
        assert (await repairs.open(tray.id, LOST)).started
        await wait_for_state(store, tray.id, S.SERVICE_REQUIRED)
        await topology.refresh()
        assert sorted(blocks(path).values()) == ["nvl-[01,03-04]", "nvl-[05-06]"]

        await world.ensure(tray.serial or "", "swap", FAULT, "")  # the tray swapped
        await repairs.start(tray.id, None, actor="op", reason="tray replaced")
        await wait_for_state(store, tray.id, S.ACTIVE)
        await topology.refresh()  # repaired, its domain not checked again: still out
        assert sorted(blocks(path).values()) == ["nvl-[01,03-04]", "nvl-[05-06]"]
        async with asyncio.timeout(5):
            await heard.wait()
        assert asked == [tray.hostname]  # its return asked for the domain's acceptance

        await passed_run(store, f"{nvsmi.CLUSTER_A}.1", domain_a)
        await topology.refresh()
        assert sorted(blocks(path).values()) == ["nvl-[01-04]", "nvl-[05-06]"]
    finally:
        await conductor.stop()
        await rejoin.aclose()
        await topology.aclose()


async def test_a_profile_holds_the_whole_domain_while_a_tray_is_repaired(
        store: Store, world: SimWorld, make_node: Any, tmp_path: Path) -> None:
    settings = validation(whole=True)
    domain_a = await trays(store, world, make_node, "gb", "1", 3, 1)
    await trays(store, world, make_node, "gb", "2", 2, 4)
    path = tmp_path / "topology.conf"
    topology = LiveTopology(store.topology, TopologySettings(format="block"),
                            [FilePublisher(path)])
    holds = RepairHolds(store.nodes, settings)  # no acceptance wired: no pass ever
    topology.hold_with(holds.held)
    conductor = Conductor(store.nodes, fake_ports(world),
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))
    repairs = RepairService(conductor, store.nodes, HealthSettings(max_repairing_fraction=1.0))
    try:
        await topology.refresh()
        assert sorted(blocks(path).values()) == ["gb-[01-03]", "gb-[04-05]"]
        await world.ensure(domain_a[2].serial or "", "inject", FAULT, "never")
        assert (await repairs.open(domain_a[2].id, LOST)).started
        await wait_for_state(store, domain_a[2].id, S.SERVICE_REQUIRED)
        await topology.refresh()
        assert list(blocks(path).values()) == ["gb-[04-05]"]  # the whole domain held
        assert await holds.held() == {"gb-01", "gb-02", "gb-03"}
    finally:
        await conductor.stop()
        await topology.aclose()
