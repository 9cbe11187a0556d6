"""The ``bmc_settings`` servicing step through the conductor (issue 25): a real SQLite store,
the ``redfish`` driver against a BMC built from a recorded Dell iDRAC
(tests/sim/redfish_manager.py: its Manager, NetworkProtocol, DellAttributes with
``@Redfish.Settings``, Dell's manager attribute registry) and against sushy-tools' emulator
(its Manager answers a ``DateTimeLocalOffset`` PATCH; it has no NetworkProtocol): applied with the
apply time the BMC offers and read back; an unknown attribute and disallowed values refused
before anything is written; a BMC that drops a setting failing the step; an IPMI BMC
refused with a clear message."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.config.servicing import ServicingSettings
from provisioner.lifecycle.service_record import ServiceRecord
from provisioner.lifecycle.states import Event, NodeState
from tests.conftest import wait_for_state
from tests.integration.test_servicing import conductor, new_node
from tests.integration.test_servicing import driver as driver  # noqa: F401  (fixture)
from tests.peers.sushy import running_sushy, sushy_unavailable_reason
from tests.sim.redfish_manager import DELL, MANAGER, ManagerSim, make_app

S = NodeState
BASELINE: dict[str, Any] = {
    "attributes": {"LCD.1.ChassisIdentifyDuration": 30,
                   "OpenIDConnectServer.12.Name": "site-idp"},
    "ipmi_over_lan": False, "ntp_servers": ["10.0.0.1", "10.0.0.2"],
    "time_offset": "+00:00"}


def settings(bmc: dict[str, Any]) -> ServicingSettings:
    return ServicingSettings.model_validate({
        "runbooks": {"onboard": {"steps": ["bmc_settings"]}},
        "profiles": {"gpu": {"onboarding_runbook": "onboard", "bmc": bmc}},
        "task_poll_s": 0.01, "task_timeout_s": 10, "bmc_good_reads": 2})


@pytest.fixture
async def idrac(aiohttp_server: Any) -> AsyncIterator[tuple[ManagerSim, str]]:
    sim = ManagerSim()
    server = await aiohttp_server(make_app(sim))
    yield sim, f"http://127.0.0.1:{server.port}"


async def run(store: Any, world: Any, make_node: Any, driver: Any, url: str,
              bmc: dict[str, Any], until: NodeState, driver_name: str = "redfish") -> Any:
    node = await new_node(make_node, url, driver_name)
    cond = conductor(store, world, driver, settings(bmc))
    await cond.fire(node.id, Event.DEPLOY, actor="op")
    done = await wait_for_state(store, node.id, until)
    await cond.stop()
    return done


async def test_applied_immediately_waited_for_and_read_back(  # type: ignore[no-untyped-def]
        store, world, make_node, idrac, driver) -> None:
    sim, url = idrac
    sim.down_after_protocol = 2  # the iDRAC restarts its network services
    done = await run(store, world, make_node, driver, url, BASELINE, S.DEPLOYING)
    assert sim.value("LCD.1.ChassisIdentifyDuration") == 30
    assert sim.value("OpenIDConnectServer.12.Name") == "site-idp"
    assert sim.protocol["IPMI"]["ProtocolEnabled"] is False
    assert sim.protocol["NTP"] == {"NTPServers": ["10.0.0.1", "10.0.0.2", ""],
                                   "NTPServers@odata.count": 3, "ProtocolEnabled": True}
    assert sim.manager["DateTimeLocalOffset"] == "+00:00"
    # the attributes went to the System resource's Settings object, applied Immediate (the
    # iDRAC lists Immediate and AtMaintenanceWindowStart); no Manager.Reset needed
    assert (f"{DELL}/System.Embedded.1/Settings", {
        "Attributes": {"LCD.1.ChassisIdentifyDuration": 30,
                       "OpenIDConnectServer.12.Name": "site-idp"},
        "@Redfish.SettingsApplyTime": {"ApplyTime": "Immediate"}}) in sim.patches
    assert (f"{MANAGER}/NetworkProtocol", {"IPMI": {"ProtocolEnabled": False}, "NTP": {
        "ProtocolEnabled": True, "NTPServers": ["10.0.0.1", "10.0.0.2"]}}) in sim.patches
    assert (MANAGER, {"DateTimeLocalOffset": "+00:00"}) in sim.patches
    assert sim.resets == [] and sim.refused == 2  # the step waited through the restart
    assert done.facts["bmc_settings"]["values"] == {
        "LCD.1.ChassisIdentifyDuration": 30, "OpenIDConnectServer.12.Name": "site-idp",
        "NetworkProtocol.IPMI.ProtocolEnabled": False,
        "NetworkProtocol.NTP.ProtocolEnabled": True,
        "NetworkProtocol.NTP.NTPServers": ["10.0.0.1", "10.0.0.2"],
        "Manager.DateTimeLocalOffset": "+00:00"}
    record = ServiceRecord.from_facts(done.facts)
    assert record is not None and record.outcome == "passed"
    steps = [h.reason for h in await store.nodes.history(done.id) if h.event == "service_step"]
    assert any("written (apply time Immediate)" in r for r in steps), steps
    assert "bmc_settings: the BMC answered 2 reads in a row" in steps
    assert "bmc_settings: 6 BMC settings at the baseline after applying them" in steps


async def test_unknown_attribute_refused_with_nothing_applied(  # type: ignore[no-untyped-def]
        store, world, make_node, idrac, driver) -> None:
    sim, url = idrac
    bad = {**BASELINE, "attributes": {"LCD.1.ChassisIdentifyDurations": 30,
                                      "LCD.1.ChassisIdentifyDuration": 30}}
    failed = await run(store, world, make_node, driver, url, bad, S.SERVICE_FAILED)
    assert "BMC settings baseline refused, nothing applied: LCD.1.ChassisIdentifyDurations: " \
           "unknown attribute (not in registry OEMAttributeRegistry)" in (failed.last_error or "")
    assert sim.patches == [] and sim.resets == []
    assert sim.value("LCD.1.ChassisIdentifyDuration") == -1


async def test_disallowed_values_refused_at_once(  # type: ignore[no-untyped-def]
        store, world, make_node, idrac, driver) -> None:
    sim, url = idrac
    bad = {"attributes": {"LCD.1.ChassisIdentifyDuration": 2592001, "PCIeSlotLFM.3.MaxLFM": 2,
                          "OpenIDConnectServer.12.Name": "x" * 129},
           "ntp_servers": ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]}
    failed = await run(store, world, make_node, driver, url, bad, S.SERVICE_FAILED)
    error = failed.last_error or ""
    assert "LCD.1.ChassisIdentifyDuration: 2592001 outside -1..2592000" in error
    assert "PCIeSlotLFM.3.MaxLFM: read-only in the registry" in error  # Dell's "Readonly"
    assert "OpenIDConnectServer.12.Name: longer than 128 characters" in error
    assert "NetworkProtocol.NTP.NTPServers: 4 servers, the BMC has 3 slots" in error
    assert sim.patches == []


async def test_on_reset_apply_time_resets_the_manager_and_waits(  # type: ignore[no-untyped-def]
        store, world, make_node, idrac, driver) -> None:
    sim, url = idrac
    sim.apply_times = ["OnReset"]
    wanted = {"attributes": {"LCD.1.ChassisIdentifyDuration": 45}}
    await run(store, world, make_node, driver, url, wanted, S.DEPLOYING)
    assert sim.patches[0][1]["@Redfish.SettingsApplyTime"] == {"ApplyTime": "OnReset"}
    assert sim.resets == ["GracefulRestart"]  # the only ResetType the iDRAC offers
    assert sim.pending == {}
    assert sim.value("LCD.1.ChassisIdentifyDuration") == 45 and sim.refused == 2


async def test_a_setting_the_bmc_drops_fails_the_step(  # type: ignore[no-untyped-def]
        store, world, make_node, idrac, driver) -> None:
    sim, url = idrac
    sim.ignored = {"LCD.1.ChassisIdentifyDuration"}
    failed = await run(store, world, make_node, driver, url,
                       {"attributes": {"LCD.1.ChassisIdentifyDuration": 30}}, S.SERVICE_FAILED)
    assert "BMC settings not in effect after they were applied: " \
           "LCD.1.ChassisIdentifyDuration=-1 (wanted 30)" in (failed.last_error or "")


async def test_stopped_while_the_bmc_restarts_resumes_without_a_second_write(  # type: ignore[no-untyped-def]
        store, world, make_node, idrac, driver) -> None:
    """The daemon goes away after the settings were written, while the BMC restarts its
    network services; the resumed step waits for the BMC and reads back, and writes
    nothing again."""
    sim, url = idrac
    sim.down_after_protocol = 10**6  # down until the test says otherwise
    node = await new_node(make_node, url)
    first = conductor(store, world, driver, settings(BASELINE))
    await first.fire(node.id, Event.DEPLOY, actor="op")
    async with asyncio.timeout(10):
        # the checkpoint is saved before the step reads the BMC: stop only once a read was
        # refused, so the daemon goes away while it is waiting for the BMC
        while "service:0:bmc_settings:applied" not in (  # noqa: ASYNC110  (the store's
                await store.nodes.get(node.id)).checkpoint or sim.refused == 0:  # state)
            await asyncio.sleep(0.02)
    await first.stop()
    written = list(sim.patches)
    assert len(written) == 3 and sim.refused > 0
    sim.down = 0
    second = conductor(store, world, driver, settings(BASELINE))
    assert await second.recover() == 1
    await wait_for_state(store, node.id, S.DEPLOYING)
    await second.stop()
    assert sim.patches == written  # Manager, System attributes, NetworkProtocol: once each


async def test_ipmi_only_bmc_fails_clearly(  # type: ignore[no-untyped-def]
        store, world, make_node, driver) -> None:
    failed = await run(store, world, make_node, driver, "127.0.0.1", BASELINE,
                       S.SERVICE_FAILED, driver_name="ipmi")
    assert "this BMC has no Redfish UpdateService (driver ipmi), nor Redfish Bios or " \
           "Manager settings" in (failed.last_error or "")


@pytest.mark.skipif(sushy_unavailable_reason() is not None,
                    reason=sushy_unavailable_reason() or "")
async def test_against_sushy_tools(  # type: ignore[no-untyped-def]
        store, world, make_node, driver, tmp_path: Path) -> None:
    with running_sushy(tmp_path / "sushy") as emu:
        # sushy-tools' Manager answers 204 to a DateTimeLocalOffset PATCH but reports the
        # offset only once DateTime was set too (managers.get_datetime): the read-back
        # catches a BMC that did not take a setting
        failed = await run(store, world, make_node, driver, emu.url,
                           {"time_offset": "+05:30"}, S.SERVICE_FAILED)
        assert "BMC settings not in effect after they were applied: " \
               "Manager.DateTimeLocalOffset='+00:00' (wanted '+05:30')" \
               in (failed.last_error or "")
        assert failed.facts["bmc_settings"]["values"] == {
            "Manager.DateTimeLocalOffset": "+00:00"}
        # sushy-tools has no NetworkProtocol: refused before anything is written
        refused = await run(store, world, make_node, driver, emu.url,
                            {"time_offset": "-03:00", "ipmi_over_lan": False},
                            S.SERVICE_FAILED)
        assert "NetworkProtocol.IPMI.ProtocolEnabled: this BMC has no Redfish " \
               "NetworkProtocol resource" in (refused.last_error or "")
        # what it reports is verified, and nothing is written when already there
        done = await run(store, world, make_node, driver, emu.url,
                         {"time_offset": "+00:00"}, S.DEPLOYING)
        steps = [h.reason for h in await store.nodes.history(done.id)
                 if h.event == "service_step"]
        assert "bmc_settings: already at the baseline" in steps
        assert "bmc_settings: 1 BMC settings at the baseline" in steps
