"""The redfish driver against sushy-tools' emulator (fake driver: power changes show 1-11 s
later) and against tests/sim/redfish.py for sessions, expiry, quirks and latency."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from provisioner.bmc.base import (
    BmcAuthFailed,
    BmcUnreachable,
    BmcUnsupported,
    BootDevice,
    PowerState,
)
from provisioner.bmc.managed import BmcManager, ManagedBmc
from provisioner.bmc.redfish import RedfishDriver, base_url
from provisioner.bmc.registry import BmcRegistry
from provisioner.config import BmcSettings
from provisioner.domain import BmcCredentials, BmcEndpoint
from tests.peers.sushy import PASSWORD, USER, Sushy, running_sushy, sushy_unavailable_reason
from tests.sim.redfish import RedfishSim, make_app

ON, OFF = PowerState.ON, PowerState.OFF
SETTINGS = BmcSettings(timeout_s=5, retries=1, retry_backoff_s=0.05, confirm_timeout_s=20,
                       confirm_poll_s=0.25)
CREDS = BmcCredentials(username=USER, password=PASSWORD)


@pytest.fixture(scope="module")
def sushy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sushy]:
    reason = sushy_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with running_sushy(tmp_path_factory.mktemp("sushy")) as emulator:
        yield emulator


@pytest.fixture
async def driver() -> AsyncIterator[RedfishDriver]:
    redfish = RedfishDriver(timeout_s=SETTINGS.timeout_s)
    yield redfish
    await redfish.aclose()


def managed(driver: RedfishDriver, url: str, creds: BmcCredentials = CREDS) -> ManagedBmc:
    manager = BmcManager(BmcRegistry({"redfish": driver}), SETTINGS)
    return manager("n1", BmcEndpoint(driver="redfish", address=url), creds)


def sushy_system(emu: Sushy) -> dict[str, Any]:
    request = urllib.request.Request(f"{emu.url}/redfish/v1/Systems/{emu.uuids[0]}")
    request.add_header("Authorization", "Basic " + __import__("base64").b64encode(
        f"{USER}:{PASSWORD}".encode()).decode())
    with urllib.request.urlopen(request, timeout=5) as response:
        return dict(json.loads(response.read()))


# -- sushy-tools ----------------------------------------------------------------------------


async def test_sushy_every_operation_with_delayed_power(sushy: Sushy,
                                                        driver: RedfishDriver) -> None:
    bmc = managed(driver, sushy.url)
    await bmc.set_power(OFF)
    assert await bmc.power_state() is OFF
    await bmc.set_boot_device(BootDevice.PXE, uefi=True)
    boot = (await asyncio.to_thread(sushy_system, sushy))["Boot"]
    assert (boot["BootSourceOverrideTarget"], boot["BootSourceOverrideMode"]) == ("Pxe", "UEFI")
    await bmc.set_power(ON)  # the emulator applies it 1-11 s later: read-back waits for it
    # the emulator itself says On the moment set_power returns (a wall-clock bound on the
    # emulator's delay was flaky: it once applied the change after 0.62 s)
    assert (await asyncio.to_thread(sushy_system, sushy))["PowerState"] == "On"
    assert await bmc.power_state() is ON
    await bmc.power_cycle()
    assert await bmc.power_state() is ON
    await bmc.set_boot_device(BootDevice.HTTP)  # stored as Pxe without an HttpBootUri
    await bmc.set_boot_device(BootDevice.DISK, persistent=True, uefi=False)
    boot = (await asyncio.to_thread(sushy_system, sushy))["Boot"]
    assert (boot["BootSourceOverrideTarget"], boot["BootSourceOverrideMode"]) == ("Hdd",
                                                                                   "Legacy")
    with pytest.raises(BmcUnsupported, match="BiosSetup not offered"):  # fatal, not retried
        await bmc.set_boot_device(BootDevice.BIOS)
    await bmc.set_power(OFF, soft=True)
    assert (await asyncio.to_thread(sushy_system, sushy))["PowerState"] == "Off"
    client = driver.clients[sushy.url]
    assert client.logins == 0  # no SessionService in sushy-tools: basic auth


async def test_sushy_wrong_password_is_fatal(sushy: Sushy, driver: RedfishDriver) -> None:
    bmc = managed(driver, sushy.url, BmcCredentials(USER, "wrong"))
    with pytest.raises(BmcAuthFailed, match="HTTP 401"):
        await bmc.power_state()


# -- sessions and quirks (tests/sim/redfish.py) ---------------------------------------------


@pytest.fixture
async def sim(aiohttp_server: Any) -> AsyncIterator[tuple[RedfishSim, str]]:
    state = RedfishSim(user=USER, password=PASSWORD, power_delay_s=0.3)
    server = await aiohttp_server(make_app(state))
    yield state, f"http://127.0.0.1:{server.port}"


async def test_one_session_reused_relogin_on_401_and_logout(
        sim: tuple[RedfishSim, str]) -> None:
    state, url = sim
    driver = RedfishDriver(timeout_s=5)
    for _ in range(3):  # three steps, each with its own handle
        bmc = managed(driver, url)
        await bmc.set_power(ON)
        await bmc.power_state()
        await bmc.aclose()
    assert (state.logins, len(state.tokens)) == (1, 1)
    state.expire_sessions()  # the BMC dropped the session
    await managed(driver, url).set_power(OFF)
    assert (state.logins, len(state.tokens)) == (2, 1)
    await driver.aclose()
    assert (state.logouts, len(state.tokens)) == (1, 0)
    assert state.max_in_flight == 1


async def test_wrong_password_at_login_is_fatal(sim: tuple[RedfishSim, str]) -> None:
    _state, url = sim
    driver = RedfishDriver(timeout_s=5)
    with pytest.raises(BmcAuthFailed, match="login refused"):
        await managed(driver, url, BmcCredentials(USER, "nope")).power_state()
    await driver.aclose()


async def test_boot_once_uefi_http_and_fallbacks(sim: tuple[RedfishSim, str],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    state, url = sim
    caplog.set_level(logging.INFO, logger="provisioner.bmc.redfish")
    driver = RedfishDriver(timeout_s=5)
    bmc = managed(driver, url)
    await bmc.set_boot_device(BootDevice.HTTP, uefi=True)
    assert state.patches[-1] == {"BootSourceOverrideTarget": "UefiHttp",
                                 "BootSourceOverrideEnabled": "Once",
                                 "BootSourceOverrideMode": "UEFI"}
    state.once_supported = state.http_boot_supported = False
    state.target, state.enabled = "None", "Disabled"
    await bmc.set_boot_device(BootDevice.HTTP, uefi=True)
    assert state.patches[-1]["BootSourceOverrideTarget"] == "Pxe"
    assert state.patches[-1]["BootSourceOverrideEnabled"] == "Continuous"
    assert "no one-time boot override" in caplog.text and "no UefiHttp" in caplog.text
    await driver.aclose()


async def test_unreachable_bmc_is_retryable() -> None:
    driver = RedfishDriver(timeout_s=2)
    with pytest.raises(BmcUnreachable):
        await managed(driver, "http://127.0.0.1:9").power_state()
    await driver.aclose()


async def test_certificate_is_verified_by_default(aiohttp_server: Any) -> None:
    del aiohttp_server
    assert base_url(BmcEndpoint("redfish", "10.1.2.3", port=8443)) == "https://10.1.2.3:8443"
    assert base_url(BmcEndpoint("redfish", "fe80::1")) == "https://[fe80::1]"
    assert RedfishDriver(timeout_s=1)._ssl is True
    assert RedfishDriver(timeout_s=1, verify_tls=False)._ssl is False


async def test_latency_one_request_in_flight_per_bmc(aiohttp_server: Any) -> None:
    sims = [RedfishSim(user=USER, password=PASSWORD, latency_s=0.2) for _ in range(5)]
    servers = [await aiohttp_server(make_app(s)) for s in sims]
    driver = RedfishDriver(timeout_s=5)
    manager = BmcManager(BmcRegistry({"redfish": driver}), SETTINGS)
    bmcs = [manager(f"n{i}", BmcEndpoint("redfish", f"http://127.0.0.1:{srv.port}"), CREDS)
            for i, srv in enumerate(servers)]
    await asyncio.gather(*(b.power_state() for b in bmcs for _ in range(3)))
    assert max(s.max_in_flight for s in sims) == 1
    assert all(s.logins == 1 for s in sims)
    await driver.aclose()


# -- UEFI HTTP boot: UefiHttp + HttpBootUri -------------------------------------------------


@pytest.fixture
async def boot_files(aiohttp_server: Any) -> tuple[str, list[str]]:
    """A boot HTTP server on loopback serving ``/ipxe/snponly.efi``; the paths it served."""
    from aiohttp import web

    served: list[str] = []

    async def nbp(request: web.Request) -> web.Response:
        served.append(request.path)
        return web.Response(body=b"MZ" + bytes(510), content_type="application/efi")

    app = web.Application()
    app.router.add_get("/ipxe/{name}", nbp)
    server = await aiohttp_server(app)
    return f"http://127.0.0.1:{server.port}", served


async def test_sushy_uefi_http_sends_the_uri_and_falls_back_when_refused(
        sushy: Sushy, driver: RedfishDriver, boot_files: tuple[str, list[str]],
        caplog: pytest.LogCaptureFixture) -> None:
    """sushy-tools (fake driver) lists HttpBootUri, fetches the image at the URI we send,
    then refuses to store the URI (400): we set UefiHttp without it (the firmware takes
    the URI from DHCP), which this emulator stores as Pxe."""
    caplog.set_level(logging.INFO, logger="provisioner.bmc")
    base, served = boot_files
    uri = f"{base}/ipxe/snponly.efi"
    bmc = managed(driver, sushy.url)
    await bmc.set_boot_device(BootDevice.DISK, uefi=False)  # Legacy: UefiHttp not listed
    assert "UefiHttp" not in (await asyncio.to_thread(sushy_system, sushy))["Boot"][
        "BootSourceOverrideTarget@Redfish.AllowableValues"]
    await bmc.set_boot_device(BootDevice.HTTP, http_uri=uri)
    assert "switching to UEFI to see UefiHttp" in caplog.text
    assert served == ["/ipxe/snponly.efi"]  # the BMC really got our URI and fetched it
    boot = (await asyncio.to_thread(sushy_system, sushy))["Boot"]
    assert (boot["BootSourceOverrideTarget"], boot["BootSourceOverrideMode"]) == ("Pxe", "UEFI")
    assert "HttpBootUri" in boot and "HttpBootUri refused" in caplog.text


async def test_uefi_http_uri_is_set_read_back_and_idempotent(
        sim: tuple[RedfishSim, str], caplog: pytest.LogCaptureFixture) -> None:
    state, url = sim
    caplog.set_level(logging.INFO, logger="provisioner.bmc")
    driver = RedfishDriver(timeout_s=5)
    bmc = managed(driver, url)
    uri = "http://10.77.0.1:8080/ipxe/snponly.efi"
    await bmc.set_boot_device(BootDevice.HTTP, http_uri=uri)
    assert state.patches == [{"BootSourceOverrideTarget": "UefiHttp",
                              "BootSourceOverrideEnabled": "Once",
                              "BootSourceOverrideMode": "UEFI", "HttpBootUri": uri}]
    assert (await bmc.boot_device()).http_uri == uri
    await bmc.set_boot_device(BootDevice.HTTP, http_uri=uri)  # already so: no PATCH
    assert len(state.patches) == 1
    other = "http://10.77.0.1:8080/ipxe/grubaa64.efi"
    await bmc.set_boot_device(BootDevice.HTTP, http_uri=other)  # a new URI is a change
    assert state.http_boot_uri == other and len(state.patches) == 2
    await bmc.set_boot_device(BootDevice.PXE)
    assert "HttpBootUri" not in state.patches[-1]
    assert (await bmc.boot_device()).http_uri is None  # the stale URI means nothing to Pxe
    await driver.aclose()


async def test_uefi_http_without_http_boot_uri_and_when_refused(
        sim: tuple[RedfishSim, str], caplog: pytest.LogCaptureFixture) -> None:
    state, url = sim
    caplog.set_level(logging.INFO, logger="provisioner.bmc")
    driver = RedfishDriver(timeout_s=5)
    uri = "http://10.77.0.1:8080/ipxe/snponly.efi"
    state.http_boot_uri_supported = False  # an older BMC (ComputerSystem < 1.9)
    await managed(driver, url).set_boot_device(BootDevice.HTTP, http_uri=uri)
    assert state.patches[-1] == {"BootSourceOverrideTarget": "UefiHttp",
                                 "BootSourceOverrideEnabled": "Once",
                                 "BootSourceOverrideMode": "UEFI"}
    assert "takes the boot file URI from DHCP" in caplog.text
    state.http_boot_uri_supported, state.http_boot_uri_writable = True, False
    state.target = "None"
    await managed(driver, url).set_boot_device(BootDevice.HTTP, http_uri=uri)
    assert [p.get("HttpBootUri") for p in state.patches[-2:]] == [uri, None]
    assert state.target == "UefiHttp" and "HttpBootUri refused" in caplog.text
    await driver.aclose()
