"""The BMC retry policy, the idempotent ensure_* templates, the circuit breaker and the
limiter, on injected time (no sleeps) and a hand-written BMC."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from provisioner.bmc.base import (
    BmcAuthFailed,
    BmcCircuitOpen,
    BmcTimeout,
    BmcUnreachable,
    BootDevice,
    BootSetting,
    PowerState,
    RetryPolicy,
    ensure_boot_device,
    ensure_power,
    ensure_power_cycle,
)
from provisioner.bmc.breaker import BreakerState, CircuitBreaker
from provisioner.bmc.guard import BmcLimiter

ON, OFF = PowerState.ON, PowerState.OFF


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class ScriptedBmc:
    """Power that changes ``lag_s`` after a request; ``errors`` raised by the next calls."""

    def __init__(self, t: FakeTime, power: PowerState = OFF, lag_s: float = 0.0) -> None:
        self.t = t
        self.power = power
        self.lag_s = lag_s
        self.pending: tuple[float, PowerState] | None = None
        self.errors: deque[Exception] = deque()
        self.requests: list[str] = []
        self.boot = BootSetting(None)

    def _maybe_fail(self) -> None:
        if self.errors:
            raise self.errors.popleft()

    async def power_state(self) -> PowerState:
        self._maybe_fail()
        if self.pending and self.t.now >= self.pending[0]:
            self.power, self.pending = self.pending[1], None
        return self.power

    async def set_power(self, state: PowerState, *, soft: bool = False) -> None:
        self._maybe_fail()
        self.requests.append(f"{'soft-' if soft else ''}{state}")
        if not (self.pending and self.pending[1] is state):  # a repeat does not restart it
            self.pending = (self.t.now + self.lag_s, state)

    async def power_cycle(self) -> None:
        self._maybe_fail()
        self.requests.append("cycle")
        self.power = OFF
        self.pending = (self.t.now + self.lag_s, ON)

    async def set_boot_device(self, device: BootDevice, *, persistent: bool = False,
                              uefi: bool = True, http_uri: str | None = None) -> None:
        self._maybe_fail()
        self.requests.append(f"boot {device}")
        self.boot = BootSetting(device, persistent, uefi, http_uri)

    async def boot_device(self) -> BootSetting:
        self._maybe_fail()
        return self.boot

    async def aclose(self) -> None:
        return None


@pytest.fixture
def t() -> FakeTime:
    return FakeTime()


def policy(t: FakeTime, **kw: float) -> RetryPolicy:
    values: dict[str, float] = {"retries": 3, "backoff_s": 1.0} | kw
    return RetryPolicy(retries=int(values["retries"]), backoff_s=values["backoff_s"],
                       deadline_s=values.get("deadline_s"), sleep=t.sleep, clock=t.clock,
                       jitter=values.get("jitter", 0.0))


async def test_power_already_in_state_is_success_without_a_request(t: FakeTime) -> None:
    bmc = ScriptedBmc(t, power=ON)
    assert await ensure_power(bmc, ON, policy=policy(t), confirm_timeout_s=10) is False
    assert bmc.requests == [] and t.sleeps == []


async def test_power_change_is_confirmed_by_read_back_after_lag(t: FakeTime) -> None:
    bmc = ScriptedBmc(t, power=OFF, lag_s=7.0)
    assert await ensure_power(bmc, ON, policy=policy(t), confirm_timeout_s=30,
                              poll_s=1.0) is True
    assert bmc.requests == ["on"] and bmc.power is ON
    assert t.now - 1000.0 == pytest.approx(7.0)


async def test_read_back_timeout_is_retried_and_never_repeats_a_landed_request(
        t: FakeTime) -> None:
    bmc = ScriptedBmc(t, power=ON, lag_s=12.0)
    await ensure_power(bmc, OFF, policy=policy(t), confirm_timeout_s=5, poll_s=1.0)
    assert bmc.power is OFF
    # the first attempt timed out waiting; the retry re-sent (still on), the change landed
    assert bmc.requests == ["off", "off"]


async def test_read_back_timeout_after_all_retries_names_the_state(t: FakeTime) -> None:
    bmc = ScriptedBmc(t, power=ON, lag_s=10_000)
    with pytest.raises(BmcTimeout, match="did not read back off within 5 s"):
        await ensure_power(bmc, OFF, policy=policy(t, retries=1), confirm_timeout_s=5)


async def test_retryable_errors_back_off_doubling_then_succeed(t: FakeTime) -> None:
    bmc = ScriptedBmc(t)
    bmc.errors.extend([BmcTimeout("t1"), BmcUnreachable("u2")])
    await ensure_power(bmc, ON, policy=policy(t), confirm_timeout_s=5)
    assert t.sleeps[:2] == [1.0, 2.0] and bmc.power is ON


async def test_retries_exhausted_raise_the_last_error(t: FakeTime) -> None:
    bmc = ScriptedBmc(t)
    bmc.errors.extend([BmcTimeout(f"t{i}") for i in range(5)])
    with pytest.raises(BmcTimeout, match="t2"):
        await ensure_power(bmc, ON, policy=policy(t, retries=2), confirm_timeout_s=5)
    assert t.sleeps == [1.0, 2.0]


async def test_deadline_stops_retrying_early(t: FakeTime) -> None:
    bmc = ScriptedBmc(t)
    bmc.errors.extend([BmcTimeout(f"t{i}") for i in range(5)])
    with pytest.raises(BmcTimeout, match="t1"):
        await ensure_power(bmc, ON, policy=policy(t, retries=5, deadline_s=2.5),
                           confirm_timeout_s=5)
    assert t.sleeps == [1.0]


@pytest.mark.parametrize("error", [BmcAuthFailed("wrong password"), BmcCircuitOpen("open")],
                         ids=["fatal", "circuit-open"])
async def test_fatal_and_circuit_open_are_never_retried(t: FakeTime, error: Exception) -> None:
    bmc = ScriptedBmc(t)
    bmc.errors.append(error)
    with pytest.raises(type(error)):
        await ensure_power(bmc, ON, policy=policy(t), confirm_timeout_s=5)
    assert t.sleeps == [] and bmc.requests == []


async def test_before_change_runs_only_when_power_changes(t: FakeTime) -> None:
    gate: list[str] = []

    async def before() -> None:
        gate.append("token")

    bmc = ScriptedBmc(t, power=ON)
    await ensure_power(bmc, ON, policy=policy(t), confirm_timeout_s=5, before_change=before)
    await ensure_power(bmc, OFF, policy=policy(t), confirm_timeout_s=5, before_change=before)
    assert gate == ["token"]


async def test_cycle_resets_a_running_node_and_powers_on_one_that_is_off(t: FakeTime) -> None:
    running = ScriptedBmc(t, power=ON, lag_s=3)
    await ensure_power_cycle(running, policy=policy(t), confirm_timeout_s=10)
    assert running.requests == ["cycle"] and running.power is ON
    off = ScriptedBmc(t, power=OFF)
    await ensure_power_cycle(off, policy=policy(t), confirm_timeout_s=10)
    assert off.requests == ["on"]


async def test_boot_device_is_idempotent_and_read_back(t: FakeTime) -> None:
    bmc = ScriptedBmc(t)
    assert await ensure_boot_device(bmc, BootDevice.PXE, policy=policy(t)) is True
    assert await ensure_boot_device(bmc, BootDevice.PXE, policy=policy(t)) is False
    assert await ensure_boot_device(bmc, BootDevice.PXE, policy=policy(t),
                                    persistent=True) is True
    assert bmc.requests == ["boot pxe", "boot pxe"]


async def test_boot_device_http_may_read_back_as_network(t: FakeTime) -> None:
    class HttpAsPxe(ScriptedBmc):
        async def set_boot_device(self, device: BootDevice, *, persistent: bool = False,
                                  uefi: bool = True, http_uri: str | None = None) -> None:
            await super().set_boot_device(BootDevice.PXE, persistent=persistent, uefi=uefi)

    bmc = HttpAsPxe(t)
    assert await ensure_boot_device(bmc, BootDevice.HTTP, policy=policy(t)) is True


# -- breaker --------------------------------------------------------------------------------


def test_breaker_opens_after_threshold_and_fails_fast_with_reason(t: FakeTime) -> None:
    breaker = CircuitBreaker("ipmi:10.0.0.9", threshold=3, reset_s=10, max_reset_s=40,
                             clock=t.clock)
    for _ in range(2):
        breaker.before_call()
        breaker.record_failure(BmcTimeout("no answer"))
    assert breaker.state is BreakerState.CLOSED
    breaker.before_call()
    breaker.record_failure(BmcTimeout("no answer"))
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(BmcCircuitOpen, match=r"ipmi:10.0.0.9: circuit open after 3 "
                                             r"consecutive failures \(next probe in 10.0 s\)"
                                             r"; last: no answer"):
        breaker.before_call()


def test_breaker_probes_once_with_exponential_back_off_and_closes_on_success(
        t: FakeTime) -> None:
    breaker = CircuitBreaker("b", threshold=1, reset_s=10, max_reset_s=40, clock=t.clock)
    breaker.before_call()
    breaker.record_failure(BmcTimeout("x"))
    waits = []
    for _ in range(4):
        opened_at = t.now
        t.now += 0.5
        with pytest.raises(BmcCircuitOpen):
            breaker.check()
        while True:  # advance until the probe is let through
            t.now += 1
            try:
                breaker.before_call()
                break
            except BmcCircuitOpen:
                continue
        waits.append(round(t.now - opened_at))
        assert breaker.state is BreakerState.HALF_OPEN
        with pytest.raises(BmcCircuitOpen, match="a probe is running"):
            breaker.before_call()  # only one probe at a time
        breaker.record_failure(BmcTimeout("still dead"))
    assert waits == [10, 20, 40, 40]  # doubles, capped
    t.now += 100
    breaker.before_call()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    breaker.before_call()


def assert_lets_a_call_through(breaker: CircuitBreaker) -> None:
    try:
        breaker.before_call()
    except BmcCircuitOpen as exc:
        pytest.fail(f"refused: {exc}")


def test_breaker_release_frees_an_abandoned_probe(t: FakeTime) -> None:
    breaker = CircuitBreaker("b", threshold=1, reset_s=1, max_reset_s=1, clock=t.clock)
    breaker.record_failure(BmcTimeout("x"))
    t.now += 2
    breaker.before_call()
    with pytest.raises(BmcCircuitOpen, match="a probe is running"):
        breaker.check()
    breaker.release()  # cancelled
    assert_lets_a_call_through(breaker)


# -- limiter --------------------------------------------------------------------------------


async def test_limiter_bounds_per_bmc_and_total() -> None:
    limiter = BmcLimiter(total=3, per_bmc=1)
    running: dict[str, int] = {}
    peak_total = 0
    release = asyncio.Event()

    async def call(key: str) -> None:
        nonlocal peak_total
        async with limiter.slot(key):
            running[key] = running.get(key, 0) + 1
            peak_total = max(peak_total, sum(running.values()))
            assert running[key] == 1
            await release.wait()
            running[key] -= 1

    tasks = [asyncio.create_task(call(f"bmc{i % 5}")) for i in range(20)]
    await asyncio.sleep(0.01)
    assert sum(running.values()) == 3
    release.set()
    await asyncio.gather(*tasks)
    assert peak_total == 3 and limiter.max_in_flight == 1


async def test_limiter_a_stuck_bmc_does_not_hold_global_slots() -> None:
    limiter = BmcLimiter(total=2, per_bmc=1)
    stuck = asyncio.Event()

    async def dead() -> None:
        async with limiter.slot("dead"):
            await stuck.wait()

    blocked = [asyncio.create_task(dead()) for _ in range(10)]
    await asyncio.sleep(0.01)
    assert limiter.in_flight("dead") == 1  # the nine others wait on the BMC, not a global slot
    async with asyncio.timeout(1):
        async with limiter.slot("healthy"):
            assert limiter.in_flight("healthy") == 1
    stuck.set()
    await asyncio.gather(*blocked)


async def test_retry_pauses_are_jittered_below_their_doubling_ceiling(t: FakeTime) -> None:
    bmc = ScriptedBmc(t)
    bmc.errors.extend([BmcTimeout(f"t{i}") for i in range(3)])
    await ensure_power(bmc, ON, policy=policy(t, jitter=0.5), confirm_timeout_s=5)
    assert len(t.sleeps) == 3
    for pause, ceiling in zip(t.sleeps, (1.0, 2.0, 4.0), strict=True):
        assert ceiling / 2 <= pause <= ceiling
