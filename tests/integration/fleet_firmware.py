"""A simulated fleet of active NVL72 trays for the firmware drift and wave tests: 18 trays
per NVLink domain (one rack each), fake BMCs, each machine's firmware in the SimWorld
(``provisioner.simulation.firmware``: BIOS 1.0.0 against a baseline of 1.2.0), the last
FirmwareInventory read in each node's facts, its domain in its validation record."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.redfish_service import SiteServicing
from provisioner.config import LifecycleSettings
from provisioner.config.servicing import ServicingSettings
from provisioner.domain import BmcCredentials, BmcEndpoint, NewNode, Node, NodeState
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.routing import RoutedServicing
from provisioner.lifecycle.service_step import FIRMWARE_KEY
from provisioner.simulation.drivers import CLIQUE, machine_key
from provisioner.simulation.firmware import FAULT, SIMULATED_FIRMWARE, SimServiceBmc
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from provisioner.validation.record import KEY as VALIDATION_KEY
from tests.conftest import fake_ports

TRAYS = 18
PROFILE = "gb200"


def servicing_settings() -> ServicingSettings:
    return ServicingSettings.model_validate({
        "runbooks": {"fw": {"steps": ["firmware_update"]},
                     "inventory": {"steps": ["firmware_inventory"]}},
        "profiles": {PROFILE: {"wave_runbook": "fw", "firmware": [
            {"id": "BIOS", "version": "1.2.0", "image": "bios-1.2.0.bin"},
            {"id": "BMC", "version": SIMULATED_FIRMWARE["BMC"], "image": "bmc.bin"}]}},
        "image_base_url": "http://127.0.0.1:1/firmware", "task_poll_s": 0.01,
        "bmc_good_reads": 1})


def clique(domain: int) -> str:
    return f"5c0f0000-0000-4000-8000-00000000nvl7.{domain:02d}"


def tray(domain: int, slot: int) -> str:
    return f"nvl{domain:02d}-t{slot:02d}"


async def make_fleet(store: Store, world: SimWorld, domains: int, *,
                     faulty: Sequence[str] = ()) -> list[Node]:
    """``domains`` × 18 active trays; those named in ``faulty`` fail every update task."""
    nodes: list[Node] = []
    for d in range(domains):
        for t in range(TRAYS):
            name = tray(d, t)
            serial = f"GB{d:02d}{t:02d}"
            node = await store.nodes.create(NewNode(
                state=NodeState.ACTIVE, hostname=name, serial=serial, profile=PROFILE,
                rack=f"rack-{d:02d}", macs=(f"02:00:00:00:{d:02x}:{t:02x}",),
                bmc=BmcEndpoint(driver="fake", address=serial, username="admin",
                                password_set=True), bmc_password="simulated"), actor="test")
            await world.ensure(serial, "boot", "power", "on")
            await world.ensure(serial, "cabled", CLIQUE, clique(d))
            if name in faulty:
                await world.ensure(serial, "inject", FAULT,
                                   "Image verification failed: signature mismatch")
            inventory = await SimServiceBmc(world, serial).firmware_inventory()
            nodes.append(await store.nodes.merge_facts(node.id, {
                FIRMWARE_KEY: {"at": "2026-11-27T10:00:00+00:00", "components": [
                    {"id": c.id, "name": c.name, "version": c.version, "updateable": True}
                    for c in inventory]},
                VALIDATION_KEY: {"passed": True, "at": "2026-11-27T09:00:00+00:00",
                                 "clique": clique(d), "checks": ["simulated"]}}))
    return nodes


def conductor(store: Store, world: SimWorld, driver: RedfishDriver) -> Conductor:
    async def credentials(node: Node) -> BmcCredentials:
        return await store.nodes.credentials(node.id)

    site = SiteServicing(servicing_settings(), driver, credentials)
    ports = dataclasses.replace(fake_ports(world), servicing=RoutedServicing(
        site, lambda node: SimServiceBmc(world, machine_key(node))))
    return Conductor(store.nodes, ports, LifecycleSettings(auto_inspect=False,
                                                           auto_deploy=False))


async def servicing_intervals(store: Store) -> list[tuple[int, str, str]]:
    """Every node's entries into and exits from ``servicing``, in commit order (the history
    rows' fleet-wide ids): (row id, node id, "in" or "out")."""
    out: list[tuple[int, str, str]] = []
    after = 0
    while True:
        rows = await store.nodes.events(after=after, limit=2000)
        if not rows:
            return out
        for row in rows:
            entry = row.entry
            if entry.to_state == "servicing" and entry.from_state != "servicing":
                out.append((row.id, str(entry.node_id), "in"))
            elif entry.from_state == "servicing" and entry.to_state != "servicing":
                out.append((row.id, str(entry.node_id), "out"))
        after = rows[-1].id


def most_at_once(intervals: Sequence[tuple[int, str, str]],
                 group_of: dict[str, str]) -> dict[str, int]:
    """The most nodes of each group being serviced at any moment, from the history."""
    now: defaultdict[str, int] = defaultdict(int)
    peak: defaultdict[str, int] = defaultdict(int)
    for _, node_id, kind in sorted(intervals):
        group = group_of[node_id]
        now[group] += 1 if kind == "in" else -1
        peak[group] = max(peak[group], now[group])
    return dict(peak)


def as_dict(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else {}
