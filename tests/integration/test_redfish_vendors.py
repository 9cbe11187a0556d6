"""The redfish driver against recorded BMCs (tests/fixtures/redfish/, provenance in its
README) replayed by tests/sim/mockup.py: power, boot overrides (once/persistent, UefiHttp
or the Pxe fallback, HttpBootUri only where the BMC has it), missing optional fields, and
the soft power-off each BMC can do (GracefulShutdown, iLO's PushPowerButton, Supermicro's
run-together list), with the hard-off fallback after the soft-off timeout; the power cycle
of a BMC that offers no restart (HPE Cray EX: ForceOff, then On once it reads Off)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from provisioner.bmc.base import (
    BmcTimeout,
    BmcUnsupported,
    BootDevice,
    PowerCycleUnsupported,
    PowerState,
    SoftOff,
    ensure_soft_off,
)
from provisioner.bmc.managed import BmcManager, ManagedBmc
from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.registry import BmcRegistry
from provisioner.config import BmcSettings
from provisioner.domain import BmcCredentials, BmcEndpoint
from tests.sim.mockup import VENDORS, Replay, make_app

ON, OFF = PowerState.ON, PowerState.OFF
SETTINGS = BmcSettings(timeout_s=5, retries=0, retry_backoff_s=0.05, confirm_timeout_s=5,
                       confirm_poll_s=0.05)
URI = "http://10.77.0.1:8080/ipxe/snponly.efi"
# vendor: (what HTTP boot becomes, the ResetType a soft off uses, the ResetTypes a cycle of
# a running machine sends); None: the BMC offers no boot override / no soft off
EXPECTED: dict[str, tuple[str | None, str | None, list[str]]] = {
    "dell-r6515": ("UefiHttp", "GracefulShutdown", ["ForceRestart"]),
    "dmtf-catfish": ("UefiHttp", "GracefulShutdown", ["ForceRestart"]),
    "dmtf-rackmount1": ("Pxe", "GracefulShutdown", ["ForceRestart"]),
    "gigabyte": ("UefiHttp", "GracefulShutdown", ["ForceRestart"]),
    "hpe-cray-ex235n": (None, None, ["ForceOff", "On"]),
    "hpe-ilo5": ("UefiHttp", "PushPowerButton", ["ForceRestart"]),
    "lenovo-sr650": ("Pxe", "GracefulShutdown", ["ForceRestart"]),
    "supermicro-actioninfo": ("UefiHttp", "GracefulShutdown", ["ForceRestart"]),
    "supermicro-x12": ("UefiHttp", "GracefulShutdown", ["ForceRestart"]),
}


def test_every_recorded_vendor_has_expectations() -> None:
    assert set(VENDORS) == set(EXPECTED)


async def started(aiohttp_server: Any, replay: Replay) -> tuple[ManagedBmc, RedfishDriver]:
    server = await aiohttp_server(make_app(replay))
    driver = RedfishDriver(timeout_s=SETTINGS.timeout_s)
    manager = BmcManager(BmcRegistry({"redfish": driver}), SETTINGS)
    bmc = manager("n1", BmcEndpoint("redfish", f"http://127.0.0.1:{server.port}"),
                  BmcCredentials(replay.user, replay.password))
    return bmc, driver


@pytest.mark.parametrize("vendor", VENDORS)
async def test_power_and_boot_overrides(aiohttp_server: Any, vendor: str,
                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="provisioner.bmc")
    replay = Replay(vendor)
    bmc, driver = await started(aiohttp_server, replay)
    http_target, _soft, cycle = EXPECTED[vendor]

    await bmc.set_power(ON)
    assert await bmc.power_state() is ON
    await bmc.power_cycle()
    assert replay.resets[1:] == cycle
    await bmc.set_power(OFF)
    assert replay.system["PowerState"] == "Off"
    assert replay.resets[0] in ("On", "ForceOn") and replay.resets[-1] == "ForceOff"

    if http_target is None:  # Cray EX: boot order only, no override (CSM boots by PXE)
        assert "BootSourceOverrideTarget" not in replay.recorded["Boot"]
        with pytest.raises(BmcUnsupported):
            await bmc.set_boot_device(BootDevice.PXE)
        await driver.aclose()
        return

    await bmc.set_boot_device(BootDevice.PXE)
    boot = replay.system["Boot"]
    assert boot["BootSourceOverrideTarget"] == "Pxe"
    assert boot["BootSourceOverrideEnabled"] == "Once"

    await bmc.set_boot_device(BootDevice.HTTP, http_uri=URI)
    assert boot["BootSourceOverrideTarget"] == http_target
    assert "HttpBootUri" not in replay.patches[-1]  # no recorded BMC has the property
    if http_target == "Pxe":
        assert "no UefiHttp boot target" in caplog.text

    await bmc.set_boot_device(BootDevice.DISK, persistent=True)
    assert boot["BootSourceOverrideTarget"] == "Hdd"
    enabled = replay.recorded["Boot"].get("BootSourceOverrideEnabled@Redfish.AllowableValues")
    want = "Once" if enabled and "Continuous" not in enabled else "Continuous"
    assert boot["BootSourceOverrideEnabled"] == want  # Lenovo SR650 offers no Continuous
    assert replay.tokens, "logged in with a session"
    await driver.aclose()
    assert not replay.tokens, "session deleted at close"


@pytest.mark.parametrize("vendor", VENDORS)
async def test_soft_off_uses_what_the_bmc_offers(aiohttp_server: Any, vendor: str) -> None:
    replay = Replay(vendor)
    bmc, driver = await started(aiohttp_server, replay)
    await bmc.set_power(ON)
    soft = EXPECTED[vendor][1]
    if soft is None:
        with pytest.raises(BmcUnsupported, match="no ResetType for soft-off"):
            await ensure_soft_off(bmc, SoftOff(timeout_s=5))
        assert await ensure_soft_off(bmc, SoftOff(timeout_s=5, hard_fallback=True)) is True
        soft = "ForceOff"
    else:
        assert await ensure_soft_off(bmc, SoftOff(timeout_s=5)) is False
    assert replay.system["PowerState"] == "Off"
    assert replay.resets[-1] == soft
    await driver.aclose()


async def test_supermicro_strict_list_falls_back_to_hard_off_when_allowed(
        aiohttp_server: Any) -> None:
    """If the firmware accepted only its list verbatim, no soft off is possible: refused
    without the fallback, ForceOff with it."""
    replay = Replay("supermicro-x12", lenient_reset=False)
    bmc, driver = await started(aiohttp_server, replay)
    await bmc.set_power(ON)
    with pytest.raises(BmcUnsupported, match="every ResetType for soft-off refused"):
        await ensure_soft_off(bmc, SoftOff(timeout_s=5))
    assert await ensure_soft_off(bmc, SoftOff(timeout_s=5, hard_fallback=True)) is True
    assert replay.resets[-1] == "ForceOff" and replay.system["PowerState"] == "Off"
    await driver.aclose()


@pytest.mark.parametrize("vendor", ["hpe-ilo5", "dell-r6515"])
async def test_ignored_soft_off_times_out_then_hard_off_if_allowed(
        aiohttp_server: Any, vendor: str) -> None:
    replay = Replay(vendor, graceful_honoured=False)
    bmc, driver = await started(aiohttp_server, replay)
    await bmc.set_power(ON)
    with pytest.raises(BmcTimeout, match="soft"):
        await ensure_soft_off(bmc, SoftOff(timeout_s=0.5))
    assert replay.system["PowerState"] == "On"
    assert await ensure_soft_off(bmc, SoftOff(timeout_s=0.5, hard_fallback=True)) is True
    assert replay.resets[-1] == "ForceOff" and replay.system["PowerState"] == "Off"
    await driver.aclose()


async def test_action_info_without_allowable_values_tries_every_type(
        aiohttp_server: Any) -> None:
    """supermicro-actioninfo names a ResetActionInfo that was not recorded (404): the
    driver reads no list and tries the types for the intent in order."""
    replay = Replay("supermicro-actioninfo")
    assert "ResetType@Redfish.AllowableValues" not in replay.reset
    bmc, driver = await started(aiohttp_server, replay)
    await bmc.set_power(ON)
    assert replay.resets == ["On"]
    await driver.aclose()


async def test_cray_ex_power_cycle_is_force_off_then_on_after_it_reads_off(
        aiohttp_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    """HPE Cray EX235n lists only ForceOff, On and the non-standard Off in its
    ResetActionInfo: no restart. The cycle powers off, waits until the System reads Off
    (the BMC applies it later: 0.3 s here), then powers on."""
    caplog.set_level(logging.INFO, logger="provisioner.bmc")
    replay = Replay("hpe-cray-ex235n", power_delay_s=0.3)
    assert "ResetType@Redfish.AllowableValues" not in replay.reset
    assert replay.allowed_resets() == {"ForceOff", "On", "Off"}
    bmc, driver = await started(aiohttp_server, replay)
    await bmc.set_power(ON)
    await bmc.power_cycle()
    assert replay.resets == ["On", "ForceOff", "On"]
    assert replay.states_at_reset == ["Off", "On", "Off"], "On sent only once it read Off"
    assert replay.system["PowerState"] == "On"
    assert "power cycle by off, then on" in caplog.text
    assert "no ResetType for cycle (offered: ForceOff, On)" in caplog.text

    # the driver alone says why, naming what the BMC offers
    raw = driver("n1", BmcEndpoint("redfish", next(iter(driver.clients))),
                 BmcCredentials(replay.user, replay.password))
    with pytest.raises(PowerCycleUnsupported, match=r"offered: ForceOff, On\)"):
        await raw.power_cycle()
    await driver.aclose()


async def test_a_machine_off_is_only_powered_on_by_a_cycle(aiohttp_server: Any) -> None:
    replay = Replay("hpe-cray-ex235n")
    bmc, driver = await started(aiohttp_server, replay)
    await bmc.power_cycle()
    assert replay.resets == ["On"]
    await driver.aclose()
