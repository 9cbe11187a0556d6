"""ManagedBmc (breaker + limiter + retries around a driver), zero-touch credentials and the
per-rack power-on stagger, on injected time and a hand-written driver."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from pydantic import SecretStr, ValidationError

from provisioner.bmc.base import BmcCircuitOpen, BmcTimeout, PowerState
from provisioner.bmc.managed import BmcManager
from provisioner.bmc.registry import BmcRegistry
from provisioner.config import BmcSettings
from provisioner.domain import BmcCredentials, BmcEndpoint, Node
from provisioner.ids import NodeId
from provisioner.lifecycle.stagger import PowerOnStagger
from provisioner.lifecycle.states import NodeState
from tests.unit.test_bmc_policy import FakeTime, ScriptedBmc

SETTINGS = BmcSettings(retries=1, retry_backoff_s=1, breaker_threshold=2, breaker_reset_s=10,
                       breaker_max_reset_s=40, confirm_timeout_s=5, confirm_poll_s=1)


def manager(t: FakeTime, driver: ScriptedBmc, seen: list[BmcCredentials] | None = None,
            settings: BmcSettings = SETTINGS) -> BmcManager:
    def factory(_node: str, _ep: BmcEndpoint, creds: BmcCredentials) -> ScriptedBmc:
        if seen is not None:
            seen.append(creds)
        return driver

    return BmcManager(BmcRegistry({"x": factory}), settings, clock=t.clock, sleep=t.sleep)


EP = BmcEndpoint("x", "10.0.0.9", port=623)
CREDS = BmcCredentials("root", "pw")


async def test_dead_bmc_opens_its_breaker_and_then_fails_fast() -> None:
    t = FakeTime()
    driver = ScriptedBmc(t)
    driver.errors.extend(BmcTimeout("no answer") for _ in range(3))
    bmcs = manager(t, driver)
    with pytest.raises(BmcTimeout):  # 2 attempts, 2 failures: the breaker opens
        await bmcs("n", EP, CREDS).power_state()
    with pytest.raises(BmcCircuitOpen, match=r"x:10.0.0.9:623: circuit open after 2 "):
        await bmcs("n", EP, CREDS).power_state()
    assert len(driver.errors) == 1  # the driver was not called while open
    other = ScriptedBmc(t, power=PowerState.ON)  # another BMC is unaffected
    assert await manager(t, other)("m", replace(EP, address="10.0.0.10"),
                                   CREDS).power_state() is PowerState.ON
    t.now += 10.5  # one probe is let through; it fails: open for twice as long (no retry)
    with pytest.raises(BmcCircuitOpen, match="after 3 consecutive failures"):
        await bmcs("n", EP, CREDS).power_state()
    assert not driver.errors
    t.now += 15
    with pytest.raises(BmcCircuitOpen, match="next probe in"):
        await bmcs("n", EP, CREDS).power_state()
    t.now += 10
    assert await bmcs("n", EP, CREDS).power_state() is PowerState.OFF  # healed: closed


async def test_set_power_is_ensured_through_the_manager() -> None:
    t = FakeTime()
    driver = ScriptedBmc(t, power=PowerState.OFF, lag_s=3)
    bmc = manager(t, driver)("n", EP, CREDS)
    await bmc.set_power(PowerState.ON)
    await bmc.set_power(PowerState.ON)
    assert driver.requests == ["on"] and driver.power is PowerState.ON


def test_missing_credentials_fall_back_to_the_site_default() -> None:
    t = FakeTime()
    seen: list[BmcCredentials] = []
    settings = SETTINGS.model_copy(update={"default_username": "site",
                                           "default_password": SecretStr("site-pw")})
    bmcs = manager(t, ScriptedBmc(t), seen, settings)
    bmcs("n", EP, BmcCredentials(None, None))
    bmcs("n", EP, BmcCredentials("own", None))
    bmcs("n", EP, CREDS)
    assert [(c.username, c.password) for c in seen] == [
        ("site", "site-pw"), ("own", "site-pw"), ("root", "pw")]
    assert "site-pw" not in repr(seen)


def node(rack: str | None, driver: str = "ipmi") -> Node:
    now = datetime.now(UTC)
    return Node(id=NodeId("n"), state=NodeState.INSPECTING, hostname=None, serial=None,
                macs=(), maintenance=False, maintenance_reason="", profile=None, rack=rack,
                position=None, facts={}, last_error="", checkpoint=(), version=1,
                history_seq=1, bmc=BmcEndpoint(driver, "a"), created_at=now, updated_at=now)


async def test_stagger_spaces_power_ons_per_rack() -> None:
    t = FakeTime()
    stagger = PowerOnStagger(2.0, exempt={"fake"}, clock=t.clock, sleep=t.sleep)
    started = t.now
    done: list[tuple[str | None, float]] = []
    for rack in ("r1", "r1", "r2", "r1", None, None):
        await stagger.wait(node(rack))
        done.append((rack, t.now - started))
    # r1 at 0, 0.5, 1.0 (sequential waits accumulate time); r2 and no-rack have their own
    assert [at for rack, at in done if rack == "r1"] == [0.0, 0.5, 1.0]
    for _ in range(5):
        await stagger.wait(node("r1", driver="fake"))  # simulated machines: no PDU
    assert t.sleeps == [0.5, 0.5, 0.5]
    await PowerOnStagger.unlimited().wait(node("r1"))


async def test_each_driver_gets_its_own_call_deadline() -> None:
    """``bmc.driver_timeout_s``: a Redfish call may take seconds where an IPMI one with the
    same answer time has long been given up (real time: the deadline is asyncio's)."""

    async def slow_power_state() -> PowerState:
        await asyncio.sleep(1.2)  # the 1 s backstop past the deadline included
        return PowerState.ON

    driver = ScriptedBmc(FakeTime())
    driver.power_state = slow_power_state  # type: ignore[method-assign]
    settings = SETTINGS.model_copy(update={"timeout_s": 0.1, "retries": 0,
                                           "driver_timeout_s": {"redfish": 0.5}})
    bmcs = BmcManager(BmcRegistry({"ipmi": lambda *_: driver, "redfish": lambda *_: driver}),
                      settings)
    with pytest.raises(BmcTimeout, match="within 1.1 s"):
        await bmcs("n", replace(EP, driver="ipmi"), CREDS).power_state()
    assert await bmcs("m", replace(EP, driver="redfish"), CREDS).power_state() is PowerState.ON
    assert (settings.timeout_for("ipmi"), settings.timeout_for("redfish")) == (0.1, 0.5)
    for wrong in ({"ipmi": 0}, {"redfsh": 30}):  # a typo is an error, not the default
        with pytest.raises(ValidationError):
            BmcSettings(driver_timeout_s=wrong)
