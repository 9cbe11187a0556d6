"""The BMC health poll against real BMC peers: OpenIPMI's ipmi_sim (records added to its SEL
from its emulator console, read by pyghmi in the IPMI worker processes) and sushy-tools'
static emulator serving recorded Redfish trees (DMTF's catfish with its SEL log service, a
GB200 tray with a leaking manifold: tests/fixtures/health/redfish/README.md). Findings go
through the real intake into a SQLite store and on to the repair ladder."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.bmc.ipmi import IpmiDriver
from provisioner.bmc.ipmi_pool import IpmiWorkers
from provisioner.bmc.managed import BmcManager
from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.registry import BmcRegistry
from provisioner.config import BmcSettings, LifecycleSettings
from provisioner.config.health import HealthSettings
from provisioner.domain import BmcEndpoint, Node
from provisioner.health.model import HealthClass
from provisioner.health.record import RepairRecord
from provisioner.health.records import FindingRecord, Origin
from provisioner.lifecycle.bmc_health import SOURCE, BmcHealthPoll
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.repair import RepairService, ladder_listener
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.findings import FindingFilter
from provisioner.store.store import Store
from tests.conftest import fake_ports
from tests.peers.ipmi_sim import (
    PASSWORD,
    USER,
    IpmiSimBmc,
    ipmi_sim_unavailable_reason,
    running_ipmi_sim,
)
from tests.peers.sushy import running_sushy_static, sushy_static_unavailable_reason

S = NodeState
TREES = Path(__file__).parents[1] / "fixtures" / "health" / "redfish"
BMC = BmcSettings(timeout_s=5, retries=0, retry_backoff_s=0.05, confirm_timeout_s=5,
                  confirm_poll_s=0.05)
HEALTH = HealthSettings(max_repairing_fraction=1.0, bmc_poll_interval_s=1)


def sel_record(sensor_type: int, sensor: int, event_type: int, data1: int) -> bytes:
    """A system-event SEL record's 13 bytes (IPMI 2.0 table 32-1): timestamp, generator
    0x0020 (the BMC), EvM revision 4, sensor type and number, event dir/type, data 1-3."""
    return struct.pack("<I", int(time.time())) + bytes(
        [0x20, 0x00, 0x04, sensor_type, sensor, event_type, data1, 0xFF, 0xFF])


UNCORRECTABLE_ECC = sel_record(0x0C, 0x02, 0x6F, 0x01)    # Memory: Uncorrectable ECC
CORRECTABLE_ECC = sel_record(0x0C, 0x02, 0x6F, 0x00)      # Memory: Correctable ECC
ECC_DEASSERTED = sel_record(0x0C, 0x02, 0xEF, 0x01)       # the same, deasserted
TEMP_UPPER_CRITICAL = sel_record(0x01, 0x30, 0x01, 0x09)  # Upper Critical going high


@pytest.fixture
def ipmi_sim(tmp_path: Path) -> Iterator[IpmiSimBmc]:
    if reason := ipmi_sim_unavailable_reason():
        pytest.skip(reason)
    with running_ipmi_sim(tmp_path / "ipmi", console=True) as bmc:
        yield bmc


@pytest.fixture
async def bmcs() -> AsyncIterator[BmcManager]:
    workers = IpmiWorkers(count=1, threads=4)
    ipmi = IpmiDriver(workers, timeout_s=BMC.timeout_s)
    redfish = RedfishDriver(timeout_s=BMC.timeout_s)
    yield BmcManager(BmcRegistry({"ipmi": ipmi, "redfish": redfish}), BMC)
    await ipmi.aclose()
    await workers.aclose()
    await redfish.aclose()


@pytest.fixture
async def health(store: Store, world: SimWorld) -> AsyncIterator[HealthFindings]:
    conductor = Conductor(store.nodes, fake_ports(world),
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))
    findings = HealthFindings(store.findings, conductor)
    findings.add_listener(ladder_listener(RepairService(conductor, store.nodes, HEALTH)))
    yield findings
    await conductor.stop()


async def out_of_service(store: Store, node_id: str) -> Node:
    """The node once its repair ladder took it out of service."""
    async with asyncio.timeout(10):
        while True:
            node = await store.nodes.get(node_id)
            if node.state in (S.REPAIRING, S.SERVICE_REQUIRED):
                return node
            await asyncio.sleep(0.02)


async def open_findings(store: Store, node_id: str) -> list[FindingRecord]:
    records, _ = await store.findings.list(FindingFilter(node_id=node_id, origin="bmc"))
    return records


async def history(store: Store, node_id: str, event: str) -> list[str]:
    return [h.reason for h in await store.nodes.history(node_id) if h.event == event]


async def test_ipmi_sel_records_become_findings_once_and_a_critical_one_starts_the_ladder(
        store: Store, health: HealthFindings, bmcs: BmcManager, ipmi_sim: IpmiSimBmc,
        make_node: Any) -> None:
    node = await make_node(S.ACTIVE, bmc=BmcEndpoint("ipmi", "127.0.0.1", ipmi_sim.port,
                                                     username=USER), bmc_password=PASSWORD)
    poll = BmcHealthPoll(store.nodes, health, bmcs, HEALTH)
    ipmi_sim.sel_add(UNCORRECTABLE_ECC)  # before the first read: history, not raised
    first = await poll.sweep()
    assert (first.read, first.failed, first.baseline, first.reported) == (1, 0, 1, 0)
    assert await open_findings(store, node.id) == []

    ipmi_sim.sel_add(CORRECTABLE_ECC)  # informational: nothing
    assert (await poll.sweep()).reported == 0
    assert await open_findings(store, node.id) == []
    assert (await poll.sweep()).unchanged == 1  # one Get SEL Info, nothing else changed

    ipmi_sim.sel_add(UNCORRECTABLE_ECC)
    ipmi_sim.sel_add(TEMP_UPPER_CRITICAL)
    assert (await poll.sweep()).reported == 2
    found = {f.cls: f for f in await open_findings(store, node.id)}
    assert set(found) == {HealthClass.HOST_MEMORY, HealthClass.THERMAL}
    assert "Uncorrectable" in found[HealthClass.HOST_MEMORY].evidence
    assert "Upper Critical going high" in found[HealthClass.THERMAL].evidence
    # the ladder took the first finding (the second joins its record as evidence)
    repaired = await out_of_service(store, node.id)
    record = RepairRecord.from_facts(repaired.facts)
    assert record is not None and record.kind in (HealthClass.HOST_MEMORY, HealthClass.THERMAL)

    # a restarted daemon (new poller, cursor from the store) raises nothing again,
    # even for a finding an operator cleared meanwhile
    await health.resolve(node.id, Origin.BMC, HealthClass.THERMAL,
                         found[HealthClass.THERMAL].subject, actor="test")
    again = await BmcHealthPoll(store.nodes, health, bmcs, HEALTH).sweep()
    assert (again.read, again.reported, again.baseline) == (1, 0, 0)
    assert {f.cls for f in await open_findings(store, node.id)} == {HealthClass.HOST_MEMORY}
    assert len(await history(store, node.id, "health_finding")) == 2  # each opened once
    assert node.id in await store.findings.cursors(SOURCE)

    ipmi_sim.sel_add(ECC_DEASSERTED)  # the BMC says the condition ended
    assert (await poll.sweep()).cleared == 1
    assert await open_findings(store, node.id) == []


@pytest.fixture
def sushy_static_ok() -> None:
    if reason := sushy_static_unavailable_reason():
        pytest.skip(reason)


async def test_redfish_log_entry_status_and_leak_become_findings_and_clear(
        store: Store, health: HealthFindings, bmcs: BmcManager, make_node: Any,
        tmp_path: Path, sushy_static_ok: None) -> None:
    with running_sushy_static(tmp_path / "catfish", TREES / "dmtf-catfish") as catfish, \
            running_sushy_static(tmp_path / "gb200", TREES / "gb200-leak") as gb200:
        server = await make_node(S.ACTIVE, bmc=BmcEndpoint("redfish", catfish.url,
                                                           username="admin"),
                                 bmc_password="pw")
        tray = await make_node(S.ACTIVE, bmc=BmcEndpoint("redfish", gb200.url,
                                                         username="admin"),
                               bmc_password="pw")
        poll = BmcHealthPoll(store.nodes, health, bmcs, HEALTH)
        first = await poll.sweep()
        assert (first.read, first.failed) == (2, 0)
        assert first.baseline == 2  # catfish's two old Critical SEL entries: not raised
        assert await open_findings(store, server.id) == []
        # the GB200 tray's manifold leaks now: a finding, and its ladder drains at once
        leak = await open_findings(store, tray.id)
        assert [(f.cls, f.subject) for f in leak] == [
            (HealthClass.LEAK, "Chassis_0_LeakDetector_1_Manifold")]
        assert "LeakDetected" in leak[0].evidence
        await out_of_service(store, tray.id)

        # catfish's BMC logs a new entry (its recorded entries' shape) and its system
        # goes Critical
        entries = catfish.read("Systems/1/LogServices/SEL/Entries")
        new = dict(entries["Members"][0])  # type: ignore[index]
        new.update({"@odata.id": "/redfish/v1/Systems/1/LogServices/SEL/Entries/3", "Id": "3",
                    "Created": "2012-03-07T14:46:00Z", "SensorType": "Power Supply",
                    "EntryCode": "Failure detected", "Message": "PSU 2 failed",
                    "SensorNumber": 7})
        entries["Members"] = [*entries["Members"], new]  # type: ignore[misc]
        catfish.write("Systems/1/LogServices/SEL/Entries", entries)
        catfish.edit("Systems/1", Status={"State": "Enabled", "Health": "Critical"})
        gb200.write("Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors/"
                    "Chassis_0_LeakDetector_1_Manifold", {
                        **gb200.read("Chassis/Chassis_0/ThermalSubsystem/LeakDetection/"
                                     "LeakDetectors/Chassis_0_LeakDetector_0_ColdPlate"),
                        "Id": "Chassis_0_LeakDetector_1_Manifold"})
        second = await poll.sweep()
        assert second.cleared == 1  # the leak detector reads OK again
        found = {f.cls: f for f in await open_findings(store, server.id)}
        assert set(found) == {HealthClass.POWER, HealthClass.HARDWARE}
        assert "PSU 2 failed" in found[HealthClass.POWER].evidence
        assert "Status.Health Critical" in found[HealthClass.HARDWARE].evidence
        assert await open_findings(store, tray.id) == []

        catfish.edit("Systems/1", Status={"State": "Enabled", "Health": "OK"})
        third = await poll.sweep()
        assert third.cleared == 1 and third.reported == 0
        assert {f.cls for f in await open_findings(store, server.id)} == {HealthClass.POWER}


def gets(server_log: Path) -> int:
    return server_log.read_text().count('"GET ')


async def test_redfish_leak_detectors_read_in_fewest_gets_that_still_see_every_one(
        store: Store, health: HealthFindings, bmcs: BmcManager, make_node: Any,
        tmp_path: Path, sushy_static_ok: None) -> None:
    """The GB200 tray twice: its root offering ``$expand`` as catfish's does (sushy-static
    answers the query with 404: the poll falls back to one GET per detector and still sees
    the leak), and its ``LeakDetection`` listing the detectors' states in
    ``LeakDetectorGroups`` as DMTF's cooling unit does (one GET for all four)."""
    leak_detection = "Chassis/Chassis_0/ThermalSubsystem/LeakDetection"
    with running_sushy_static(tmp_path / "expand", TREES / "gb200-leak") as expand, \
            running_sushy_static(tmp_path / "groups", TREES / "gb200-leak") as groups:
        expand.edit("", ProtocolFeaturesSupported=expand_read(TREES / "dmtf-catfish"))
        states = {m["@odata.id"]: groups.read(m["@odata.id"].removeprefix("/redfish/v1/"))
                  for m in groups.read(f"{leak_detection}/LeakDetectors")["Members"]}  # type: ignore[union-attr]
        cdu = read_json(TREES / "dmtf-cooling-unit" / "ThermalEquipment/CDUs/1/LeakDetection")
        group = {**cdu["LeakDetectorGroups"][0], "Detectors": [
            {"DataSourceUri": uri, "DeviceName": str(state["Name"]),
             "DetectorState": state["DetectorState"]} for uri, state in states.items()]}
        groups.edit(leak_detection, LeakDetectorGroups=[group])
        nodes = [await make_node(S.ACTIVE, bmc=BmcEndpoint("redfish", s.url, username="admin"),
                                 bmc_password="pw") for s in (expand, groups)]
        poll = BmcHealthPoll(store.nodes, health, bmcs, HEALTH)
        assert (await poll.sweep()).read == 2
        for node in nodes:  # both see the leaking manifold
            assert [f.subject for f in await open_findings(store, node.id)] == [
                "Chassis_0_LeakDetector_1_Manifold"]
        logs = [tmp_path / "expand" / "sushy-static.log", tmp_path / "groups" / "sushy-static.log"]
        assert "$expand" in logs[0].read_text()  # tried, answered 404
        before = [gets(log) for log in logs]
        await poll.sweep()
        assert [gets(log) - b for log, b in zip(logs, before, strict=True)] == [5, 2]
        # the tray's firmware stops listing the groups: that poll reads nothing (the leak
        # stays open), the next discovers the detectors again and reads them one by one
        groups.edit(leak_detection, LeakDetectorGroups=[])
        lost = await poll.sweep()
        assert (lost.read, lost.skipped, lost.cleared) == (1, 1, 0)
        assert len(await open_findings(store, nodes[1].id)) == 1
        before = gets(logs[1])
        assert (await poll.sweep()).cleared == 0
        assert [f.subject for f in await open_findings(store, nodes[1].id)] == [
            "Chassis_0_LeakDetector_1_Manifold"]
        groups.edit(leak_detection, LeakDetectorGroups=[group])
        # the manifold dries: both clear it
        for server in (expand, groups):
            server.write(f"{leak_detection}/LeakDetectors/Chassis_0_LeakDetector_1_Manifold",
                         {**states[f"/redfish/v1/{leak_detection}/LeakDetectors/"
                                   "Chassis_0_LeakDetector_0_ColdPlate"],
                          "Id": "Chassis_0_LeakDetector_1_Manifold"})
        group["Detectors"][3]["DetectorState"] = "OK"
        groups.edit(leak_detection, LeakDetectorGroups=[group])
        assert (await poll.sweep()).cleared == 2


def read_json(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "index.json").read_text())
    return data


def expand_read(tree: Path) -> object:
    return read_json(tree)["ProtocolFeaturesSupported"]
