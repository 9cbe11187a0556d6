"""Firmware waves over a simulated fleet of active NVL72 trays (18 per NVLink domain; 1,008
trays in 56 domains for the share and the threshold): the wave keeps every domain's share
at every moment (asserted from the nodes' history, in
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
from provisioner.lifecycle.states import IN_FLIGHT
from provisioner.lifecycle.waves import WaveDriver
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.integration.fleet_firmware import (
    PROFILE,
    check_history,
    clique,
    conductor,
    drive_wave,
    make_fleet,
    most_at_once,
    servicing_intervals,
    tray,
    until,
)


@pytest.fixture
async def driver() -> AsyncIterator[RedfishDriver]:
    redfish = RedfishDriver(timeout_s=5)
    yield redfish
    await redfish.aclose()


async def test_wave_over_1008_trays_keeps_each_domains_share_and_stops_at_the_threshold(
        store: Store, world: SimWorld, driver: RedfishDriver) -> None:
    """56 NVL72 domains (1,008 trays), 10 at once, a quarter of a domain (4 trays) at most:
    the begun domains are finished first, so the wave works through domains 0-9, then 10,
    whose first trays fail every update: it stops at the third failure, the trays being
    serviced finish, none starts after. (bench/wave_bench.py runs the same wave with the
    failures in the last domain: through the whole fleet.)"""
    faulty = {tray(10, 0), tray(10, 1), tray(10, 2)}
    run = await drive_wave(store, world, driver, domains=56, faulty=sorted(faulty),
                           max_nodes=10)
    try:
        peaks = await check_history(store, run, max_nodes=10)
        counts = by_status(await read_fleet(store.nodes, run.conductor.servicing))
    finally:
        await run.conductor.stop()
    print(f"\nwave over {len(run.fleet)} trays: {run.seconds:.1f} s; {peaks}")
    ended, names = run.wave, {n.id: n.hostname for n in run.fleet}
    assert ended.status == "failed" and "stopped after 3 failures (limit 3)" in ended.reason
    assert {names[i] for i, w in ended.nodes.items() if w.status == "failed"} == faulty
    for node_id in (i for i in names if names[i] in faulty):
        node = await store.nodes.get(node_id)
        assert node.state == NodeState.SERVICE_FAILED
        assert "Image verification failed: signature mismatch" in (node.last_error or "")
    # the domain's limit was reached, not merely respected (4 of its 18), while more than
    # one domain was in service (the fleet's 10 allowed more: the domain share held it)
    assert peaks["domain_peak"] == 4 and 4 < peaks["fleet_peak"] <= 10
    assert peaks["passed"] >= 9 * 18 and peaks["pending"] > 0
    # the firmware: updated once on every passed tray; the drift view agrees
    ledger = world.ledger_blocking()
    passed = [n for n in run.fleet if ended.nodes[n.id].status == "passed"]
    for node in passed:
        assert ledger[node.serial or "", "fw_update:BIOS"] == (1, 1)
    for node in passed[:: max(1, len(passed) // 20)]:
        assert await world.get(node.serial or "", "fw:BIOS") == "1.2.0"
    left = [n for n in run.fleet if ended.nodes[n.id].status == "pending"]
    assert {(await store.nodes.get(n.id)).state for n in left} == {NodeState.ACTIVE}
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
        await until(store, wave.id, "passed:10", 120)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        # the daemon stops mid-wave as serve does (shutdown_timeout_s): running sub-steps
        # checkpoint, no new one starts
        await first.stop(grace_s=10)
    mid = await store.waves.get(wave.id)
    assert mid.status == "running" and mid.count("pending") > 0
    left = await store.nodes.in_states(IN_FLIGHT)  # none when it stopped between batches
    second = conductor(store, world, driver)
    assert await second.recover() == len(left)  # the runbooks it left resume where they were
    again = WaveDriver(store.waves, store.nodes, second, interval_s=0.05)
    task = asyncio.create_task(again.run())
    try:
        ended = await until(store, wave.id, "ended", 180)
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
