"""IPMI worker processes (``bmc/ipmi_pool.py``): a worker that hangs (SIGSTOP) or whose
pyghmi call never returns is killed and replaced; its BMCs' calls fail as retryable and
log in again afterwards; every other worker's BMCs keep answering on time; sessions are
logged out at shutdown. Against pyghmi's server-side Bmc (tests/sim/ipmi_bmc.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest

from provisioner.bmc.base import BmcTimeout, BmcUnreachable, PowerState
from provisioner.bmc.ipmi import IpmiBmc, IpmiDriver
from provisioner.bmc.ipmi_pool import IpmiWorkers
from provisioner.domain import BmcCredentials, BmcEndpoint
from tests.sim.ipmi_bmc import SimBmcs

TIMEOUT_S = 5.0


@pytest.fixture
def sims() -> Iterator[SimBmcs]:
    with SimBmcs(count=12, per_process=4) as sim:
        yield sim


def handles(driver: IpmiDriver, sim: SimBmcs) -> dict[int, IpmiBmc]:
    creds = BmcCredentials(sim.user, sim.password)
    return {port: driver(f"n{port}", BmcEndpoint("ipmi", "127.0.0.1", port), creds)
            for port in sim.ports}


async def calls(bmc: IpmiBmc, n: int) -> tuple[list[str], float]:
    """n calls in a row: each outcome, and the slowest call's seconds."""
    outcomes, slowest = [], 0.0
    for _ in range(n):
        started = time.monotonic()
        try:
            outcomes.append(str(await bmc.power_state()))
        except (BmcUnreachable, BmcTimeout) as exc:
            outcomes.append(type(exc).__name__ + ": " + str(exc))
        slowest = max(slowest, time.monotonic() - started)
    return outcomes, slowest


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether process ``pid`` ends (killed and reaped) within ``within_s``."""
    for _ in range(int(within_s / 0.05)):
        if not alive(pid):
            return True
        await asyncio.sleep(0.05)
    return not alive(pid)


async def login_all(bmcs: list[IpmiBmc]) -> None:
    """Warm-up, not under test: every BMC logged in (a cold start on a loaded 2-core
    machine may miss a 2 s deadline once; the driver's callers retry such errors)."""
    async def one(bmc: IpmiBmc) -> None:
        for attempt in range(3):
            try:
                await bmc.power_state()
                return
            except (BmcUnreachable, BmcTimeout):
                if attempt == 2:
                    raise

    await asyncio.gather(*(one(b) for b in bmcs))


def by_slot(workers: IpmiWorkers, ports: list[int]) -> dict[int, list[int]]:
    slots: dict[int, list[int]] = {}
    for port in ports:
        slots.setdefault(workers.slot_of("127.0.0.1", port), []).append(port)
    return slots


async def test_a_stopped_worker_is_replaced_and_no_other_bmc_waits(sims: SimBmcs) -> None:
    workers = IpmiWorkers(count=3, threads=4, heartbeat_s=0.2, heartbeat_timeout_s=2.5,
                          grace_s=1.0)  # 1 s missed beats on this loaded 2-core machine
    driver = IpmiDriver(workers, timeout_s=TIMEOUT_S)
    bmcs = handles(driver, sims)
    await login_all(list(bmcs.values()))
    before = sims.stats()
    slots = by_slot(workers, sims.ports)
    assert len(slots) >= 2, slots  # ports are random: at least two workers in use
    victim_slot, victims = next(iter(slots.items()))
    others = [p for p in sims.ports if p not in victims]
    old_pid = workers.pid(victim_slot)
    assert old_pid is not None
    os.kill(old_pid, signal.SIGSTOP)  # hangs: no answers, no heartbeat, still alive
    try:
        results = dict(zip(bmcs, await asyncio.gather(
            *(calls(bmcs[p], 10) for p in sims.ports)), strict=True))
    finally:
        if alive(old_pid):
            os.kill(old_pid, signal.SIGCONT)
    for port in others:  # never waited for the hung worker
        outcomes, slowest = results[port]
        assert outcomes == ["off"] * 10, (port, outcomes)
        assert slowest < TIMEOUT_S, (port, slowest)
    for port in victims:  # failed as retryable once, then served by the new worker
        outcomes, _ = results[port]
        assert "missed its heartbeat" in outcomes[0], outcomes
        assert outcomes[0].startswith("BmcUnreachable") and outcomes[-1] == "off", outcomes
    assert workers.replaced == 1
    assert workers.pid(victim_slot) not in (None, old_pid)
    assert await gone(old_pid), "the hung worker was killed"
    stats = sims.stats()
    opened = {p: stats[p]["opened"] - before[p]["opened"] for p in sims.ports}
    assert all(opened[p] == 1 for p in victims), opened  # a new session after the swap
    assert all(opened[p] == 0 for p in others), opened
    await driver.aclose()
    stats = sims.stats()
    assert all(stats[p]["closed"] >= 1 for p in sims.ports)  # logged out at shutdown


async def test_a_call_stuck_in_pyghmi_gets_its_worker_replaced(sims: SimBmcs) -> None:
    """A BMC that stops answering mid-session (its simulator SIGSTOPped): its calls fail on
    our deadline; pyghmi's thread stays stuck, so ``grace_s`` later the worker is killed and
    replaced. BMCs of the other workers never notice."""
    workers = IpmiWorkers(count=3, threads=4, heartbeat_s=0.2, heartbeat_timeout_s=5.0,
                          grace_s=1.0)
    driver = IpmiDriver(workers, timeout_s=TIMEOUT_S)
    with SimBmcs(count=1) as doomed:
        everyone = [*sims.ports, doomed.ports[0]]
        creds = BmcCredentials(sims.user, sims.password)
        bmcs = {p: driver(f"n{p}", BmcEndpoint("ipmi", "127.0.0.1", p), creds)
                for p in everyone}
        await login_all(list(bmcs.values()))
        slot = workers.slot_of("127.0.0.1", doomed.ports[0])
        old_pid = workers.pid(slot)
        others = [p for p in sims.ports if workers.slot_of("127.0.0.1", p) != slot]
        assert others
        os.kill(doomed.procs[0].pid, signal.SIGSTOP)
        try:
            with pytest.raises(BmcTimeout):
                await bmcs[doomed.ports[0]].power_state()
            results = await asyncio.gather(*(calls(bmcs[p], 10) for p in others))
            assert all(o == ["off"] * 10 for o, _ in results), results
            assert max(s for _, s in results) < TIMEOUT_S
            for _ in range(200):  # up to 10 s: the deadline has passed, grace_s is 1 s
                if workers.replaced:
                    break
                await asyncio.sleep(0.05)
            assert workers.replaced == 1
            assert old_pid is not None and await gone(old_pid)
        finally:
            os.kill(doomed.procs[0].pid, signal.SIGCONT)
    await driver.aclose()


async def test_workers_stop_at_close(sims: SimBmcs) -> None:
    workers = IpmiWorkers(count=2, threads=2)
    driver = IpmiDriver(workers, timeout_s=TIMEOUT_S)
    bmcs = handles(driver, sims)
    assert {await b.power_state() for b in bmcs.values()} == {PowerState.OFF}
    pids = [pid for pid in (workers.pid(i) for i in range(2)) if pid is not None]
    assert pids
    await driver.aclose()
    assert [await gone(pid) for pid in pids] == [True] * len(pids)
    assert all(s["closed"] == s["opened"] == 1 for s in sims.stats().values())
