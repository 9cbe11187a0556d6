"""Firmware waves over a simulated fleet of active NVL72 trays (18 per NVLink domain): the
wave keeps every domain's share at every moment (asserted from the nodes' history, in
commit order), stops at its failure threshold (simulated BMCs whose update task fails),
survives its daemon stopping mid-wave (its row and the node checkpoints: no node serviced
twice) and ends with each domain's trays on equal firmware."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from provisioner.bmc.redfish import RedfishDriver
from provisioner.domain import NodeState
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.drift import by_status, read_fleet
from provisioner.lifecycle.waves import WaveDriver
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from provisioner.store.waves import Wave
from tests.integration.fleet_firmware import (
    PROFILE,
    clique,
    conductor,
    make_fleet,
    most_at_once,
    servicing_intervals,
    tray,
)


@pytest.fixture
async def driver() -> AsyncIterator[RedfishDriver]:
    redfish = RedfishDriver(timeout_s=5)
    yield redfish
    await redfish.aclose()


async def _until(store: Store, wave_id: str, done: str, timeout_s: float) -> Wave:
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


async def test_wave_keeps_each_domains_share_and_stops_at_the_failure_threshold(
        store: Store, world: SimWorld, driver: RedfishDriver) -> None:
    faulty = {tray(10, 0), tray(10, 1), tray(10, 2)}
    fleet = await make_fleet(store, world, 11, faulty=sorted(faulty))  # 198 trays
    cond = conductor(store, world, driver)
    waves = WaveDriver(store.waves, store.nodes, cond, interval_s=0.05)
    wave = await waves.start(PROFILE, actor="op", max_nodes=24, max_domain_share=0.25,
                             max_rack_share=1.0, stop_after_failures=3)
    assert wave.status == "running" and len(wave.nodes) == 198
    assert set(wave.domain_sizes.values()) == {18}
    task = asyncio.create_task(waves.run())
    try:
        ended = await _until(store, wave.id, "ended", 240)
        entries = len([i for i in await servicing_intervals(store) if i[2] == "in"])
        await asyncio.sleep(0.5)  # ten more rounds: a stopped wave starts nothing
        assert len([i for i in await servicing_intervals(store) if i[2] == "in"]) == entries
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await cond.stop()
    names = {n.id: n.hostname for n in fleet}
    assert ended.status == "failed" and "stopped after 3 failures (limit 3)" in ended.reason
    failed = {names[i] for i, w in ended.nodes.items() if w.status == "failed"}
    assert failed == faulty
    for node_id in (i for i in names if names[i] in faulty):
        node = await store.nodes.get(node_id)
        assert node.state == NodeState.SERVICE_FAILED
        assert "Image verification failed: signature mismatch" in (node.last_error or "")
    left = [i for i, w in ended.nodes.items() if w.status == "pending"]
    assert left and all(w.status in ("passed", "failed", "pending")
                        for w in ended.nodes.values())
    # the share, at every moment, from the history in commit order
    intervals = await servicing_intervals(store)
    domain_of = {n.id: names[n.id][:5] for n in fleet}
    peaks = most_at_once(intervals, domain_of)
    assert max(peaks.values()) == 4 and all(p <= 4 for p in peaks.values())  # 18 × 0.25
    assert most_at_once(intervals, dict.fromkeys(names, "all"))["all"] <= 24
    entered = Counter(node_id for _, node_id, kind in intervals if kind == "in")
    assert set(entered.values()) == {1}  # no node twice
    assert len(entered) == ended.count("passed") + 3
    # the firmware: updated once on every passed tray; the drift view agrees
    ledger = world.ledger_blocking()
    passed = [n for n in fleet if ended.nodes[n.id].status == "passed"]
    for node in passed:
        assert await world.get(node.serial or "", "fw:BIOS") == "1.2.0"
        assert ledger[node.serial or "", "fw_update:BIOS"] == (1, 1)
    for node_id in left:
        assert (node_id and (await store.nodes.get(node_id)).state) == NodeState.ACTIVE
    counts = by_status(await read_fleet(store.nodes, cond.servicing))
    assert counts == {"conforming": len(passed), "drifted": len(left), "updating": 0,
                      "failed": 3, "unknown": 0}


async def test_wave_survives_its_daemon_stopping_and_domains_end_equal(
        store: Store, world: SimWorld, driver: RedfishDriver) -> None:
    fleet = await make_fleet(store, world, 3)  # 54 trays
    first: Conductor = conductor(store, world, driver)
    waves = WaveDriver(store.waves, store.nodes, first, interval_s=0.05)
    wave = await waves.start(PROFILE, actor="op", max_nodes=6, max_domain_share=0.25,
                             max_rack_share=0.25, stop_after_failures=1)
    task = asyncio.create_task(waves.run())
    try:
        await _until(store, wave.id, "passed:10", 120)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        # the daemon stops mid-wave as serve does (shutdown_timeout_s): running sub-steps
        # checkpoint, no new one starts
        await first.stop(grace_s=10)
    mid = await store.waves.get(wave.id)
    assert mid.status == "running" and mid.count("pending") > 0
    second = conductor(store, world, driver)
    assert await second.recover() > 0  # the runbooks it left resume where they were
    again = WaveDriver(store.waves, store.nodes, second, interval_s=0.05)
    task = asyncio.create_task(again.run())
    try:
        ended = await _until(store, wave.id, "ended", 180)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await second.stop()
    assert ended.status == "done" and ended.count("passed") == 54, ended.reason
    intervals = await servicing_intervals(store)
    entered = Counter(node_id for _, node_id, kind in intervals if kind == "in")
    assert len(entered) == 54 and set(entered.values()) == {1}
    ledger = world.ledger_blocking()
    assert {ledger[n.serial or "", "fw_update:BIOS"] for n in fleet} == {(1, 1)}
    peaks = most_at_once(intervals, {n.id: n.rack or "" for n in fleet})
    assert set(peaks.values()) <= {1, 2, 3, 4}
    assert most_at_once(intervals, {n.id: "all" for n in fleet})["all"] <= 6
    # each NVLink domain's trays end with equal firmware, at the baseline
    drift = await read_fleet(store.nodes, second.servicing)
    assert {f.status for f in drift} == {"conforming"}
    for d in range(3):
        versions = {await world.get(n.serial or "", "fw:BIOS") for n in fleet
                    if n.rack == f"rack-{d:02d}"}
        assert versions == {"1.2.0"}
        assert {f.domain for f in drift if f.rack == f"rack-{d:02d}"} == {clique(d)}


async def test_only_the_fleet_singletons_leader_drives_a_wave(
        store: Store, world: SimWorld, driver: RedfishDriver) -> None:
    """Under HA every daemon runs a driver only while it leads ``fleet``; a daemon that
    lost the lead (a stale fence) writes nothing and starts nothing."""
    await make_fleet(store, world, 1)
    cond = conductor(store, world, driver)
    fence = await store.ownership.lead("fleet")
    assert fence is not None
    leader = WaveDriver(store.waves, store.nodes, cond, lead=lambda: (store.instance, fence))
    stale = WaveDriver(store.waves, store.nodes, cond, lead=lambda: ("daemon-b", fence))
    follower = WaveDriver(store.waves, store.nodes, cond, lead=lambda: None)
    wave = await stale.start(PROFILE, actor="op", max_nodes=2, max_domain_share=1.0,
                             max_rack_share=1.0)
    try:
        for other in (stale, follower):
            await other.tick()
            assert (await store.waves.get(wave.id)).version == wave.version
            assert await store.nodes.in_states([NodeState.SERVICING]) == []
        await leader.tick()
        driven = await store.waves.get(wave.id)
        assert driven.version == wave.version + 1 and driven.count("starting") == 2
        assert len(await store.nodes.in_states([NodeState.SERVICING])) == 2
    finally:
        await cond.stop()
