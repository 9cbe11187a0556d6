"""The fleet's baseline gauges of /metrics (``drift.gauge_fleet``) read each node's firmware,
BIOS and BMC settings facts alone, out of the database's JSON (SQLite ``json_extract``,
PostgreSQL ``->>``), and count exactly what the drift view (``read_fleet``, every node's
whole facts) counts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.redfish_service import SiteServicing
from provisioner.domain import BmcCredentials, NewNode, Node, NodeState
from provisioner.lifecycle.drift import counts, gauge_fleet, part_counts, read_fleet
from provisioner.lifecycle.service_step import FIRMWARE_KEY
from provisioner.simulation.firmware import SIMULATED_FIRMWARE
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.integration.fleet_firmware import PROFILE, make_fleet, servicing_settings


@pytest.fixture
async def driver() -> AsyncIterator[RedfishDriver]:
    redfish = RedfishDriver(timeout_s=5)
    yield redfish
    await redfish.aclose()


async def test_gauge_counts_equal_the_drift_views(any_store: Store, tmp_path: Path,
                                                  driver: RedfishDriver) -> None:
    async def credentials(node: Node) -> BmcCredentials:
        return await any_store.nodes.credentials(node.id)

    servicing = SiteServicing(servicing_settings(), driver, credentials)
    world = SimWorld(tmp_path / "world.sqlite")
    try:
        trays = await make_fleet(any_store, world, 1)  # 18 trays: BIOS 1.0.0, baseline 1.2.0
    finally:
        world.close()
    at_baseline = [{"id": "BIOS", "version": "1.2.0"},
                   {"id": "BMC", "version": SIMULATED_FIRMWARE["BMC"]}]
    await any_store.nodes.merge_facts(trays[0].id, {FIRMWARE_KEY: {
        "at": "2026-11-27T11:00:00+00:00", "components": at_baseline}})
    await any_store.nodes.merge_facts(trays[1].id, {FIRMWARE_KEY: "not an object"})
    await any_store.nodes.merge_facts(trays[2].id, {FIRMWARE_KEY: None})
    await any_store.nodes.transition(trays[3], to_state=NodeState.SERVICING,
                                     event="service", actor="test")
    await any_store.nodes.create(NewNode(state=NodeState.ACTIVE, hostname="unread",
                                         profile=PROFILE), actor="test")
    other = await any_store.nodes.create(NewNode(state=NodeState.ACTIVE, hostname="cpu-1",
                                                 profile="cpu"), actor="test")
    await any_store.nodes.merge_facts(other.id, {FIRMWARE_KEY: {"components": []}})

    light, whole = (await gauge_fleet(any_store.nodes, servicing),
                    await read_fleet(any_store.nodes, servicing))
    gauge = counts(light)
    assert gauge == counts(whole) and part_counts(light) == part_counts(whole)
    assert {k: v for k, v in gauge.items() if v} == {
        ("conforming", PROFILE): 1, ("drifted", PROFILE): 14, ("updating", PROFILE): 1,
        ("unknown", PROFILE): 3}  # two unread here, one never read; "cpu": no baseline
