"""A simulated fleet of active NVL72 trays for the firmware drift and wave tests: 18 trays
per NVLink domain (one rack each), fake BMCs, each machine's firmware in the SimWorld
(``provisioner.simulation.firmware``: BIOS 1.0.0 against a baseline of 1.2.0), the last
FirmwareInventory read in each node's facts, its domain in its validation record."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter, defaultdict
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
from provisioner.lifecycle.waves import WaveDriver
from provisioner.simulation.drivers import CLIQUE, machine_key
from provisioner.simulation.firmware import FAULT, SIMULATED_FIRMWARE, SimServiceBmc
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from provisioner.store.waves import Wave
from provisioner.validation.drift import Limits
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


async def until(store: Store, wave_id: str, done: str, timeout_s: float) -> Wave:
    """The wave once ``done`` holds: ``ended`` (not running, no node in servicing) or
    ``passed:N`` (at least N of its nodes passed)."""
    async with asyncio.timeout(timeout_s):
        while True:
            wave = await store.waves.get(wave_id)
            if done == "ended":
                busy = await store.nodes.in_states([NodeState.SERVICING])
                if wave.finished_at is not None and not busy:
                    return wave
            elif wave.count("passed") >= int(done.split(":")[1]):
                return wave
            await asyncio.sleep(0.1)


@dataclasses.dataclass
class WaveRun:
    fleet: list[Node]
    conductor: Conductor
    wave: Wave
    seconds: float  # from the wave's start to its end (no node left in servicing)
    idle_starts: int  # nodes that entered servicing in the half second after it ended


async def drive_wave(store: Store, world: SimWorld, driver: RedfishDriver, *, domains: int,
                     faulty: Sequence[str], max_nodes: int, share: float = 0.25,
                     failures: int = 3, timeout_s: float = 600) -> WaveRun:
    """``domains`` × 18 active trays, a wave over all of them (at most ``max_nodes`` at
    once, ``share`` of a domain, racks unlimited), driven until it ends. The caller stops
    the returned conductor."""
    fleet = await make_fleet(store, world, domains, faulty=faulty)
    cond = conductor(store, world, driver)
    waves = WaveDriver(store.waves, store.nodes, cond, interval_s=0.05)
    wave = await waves.start(PROFILE, actor="op", max_nodes=max_nodes, max_domain_share=share,
                             max_rack_share=1.0, stop_after_failures=failures)
    assert wave.status == "running" and len(wave.nodes) == TRAYS * domains
    assert set(wave.domain_sizes.values()) == {TRAYS}
    began = time.monotonic()
    task = asyncio.create_task(waves.run())
    try:
        ended = await until(store, wave.id, "ended", timeout_s)
        seconds = time.monotonic() - began
        entries = sum(1 for i in await servicing_intervals(store) if i[2] == "in")
        await asyncio.sleep(0.5)  # ten more rounds: a stopped wave starts nothing
        after = sum(1 for i in await servicing_intervals(store) if i[2] == "in")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return WaveRun(fleet, cond, ended, seconds, after - entries)


async def check_history(store: Store, run: WaveRun, *, max_nodes: int,
                        share: float = 0.25) -> dict[str, int]:
    """From the nodes' history in commit order, at every moment: no domain had more than
    its share in servicing, the fleet no more than ``max_nodes``; each node entered
    servicing at most once, and those that did are the wave's passed and failed ones.
    Returns the peaks (the busiest domain's, the fleet's) and the counts."""
    intervals = await servicing_intervals(store)
    names = {n.id: n.hostname or "" for n in run.fleet}
    domain_of = {n.id: names[n.id][:5] for n in run.fleet}
    per_domain = Limits(max_nodes, share, 1.0).per_group(TRAYS, share)
    peaks = most_at_once(intervals, domain_of)
    assert max(peaks.values()) <= per_domain, peaks
    fleet_peak = most_at_once(intervals, dict.fromkeys(names, "all"))["all"]
    assert fleet_peak <= max_nodes
    entered = Counter(node_id for _, node_id, kind in intervals if kind == "in")
    assert set(entered.values()) == {1}  # no node twice
    settled = {i for i, w in run.wave.nodes.items() if w.status in ("passed", "failed")}
    assert set(entered) == settled
    assert run.idle_starts == 0
    return {"domain_peak": max(peaks.values()), "domain_limit": per_domain,
            "fleet_peak": fleet_peak, "domains_touched": len(peaks),
            "serviced": len(entered), "passed": run.wave.count("passed"),
            "failed": run.wave.count("failed"), "pending": run.wave.count("pending")}
