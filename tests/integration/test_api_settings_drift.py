"""BIOS and BMC settings in the fleet's drift (issue 25): a profile with a firmware, a BIOS
and a BMC settings baseline; each node's BIOS attributes and BMC settings as last read in its
facts (as the ``bios_settings``, ``bmc_settings`` and ``firmware_inventory`` steps keep
them). Through the REST API, the CLI, /metrics and the console: a node whose BIOS or BMC
settings differ is drifted, naming the setting, its value and the wanted one; one being
serviced is updating; one whose runbook failed is failed; one never read is unknown."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from provisioner.api.app import make_app
from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.redfish_service import SiteServicing
from provisioner.cli.entry import main
from provisioner.config import ApiSettings, LifecycleSettings
from provisioner.config.servicing import ServicingSettings
from provisioner.domain import BmcCredentials, BmcEndpoint, NewNode, Node, NodeState, Role
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.service_bmc import BMC_KEY
from provisioner.lifecycle.service_step import BIOS_KEY, FIRMWARE_KEY
from provisioner.metrics import Metrics
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports
from tests.integration.test_api import Api
from tests.integration.test_console import Browser, Elements

DRIFT = "/api/v1/firmware/drift"
PROFILE = "hgx"
AT = "2026-11-27T12:00:00+00:00"
FIRMWARE = {"at": AT, "components": [{"id": "BIOS", "name": "BIOS", "version": "2.1.0",
                                      "updateable": True}]}
BIOS = {"ProcTurboMode": "Enabled", "QuietBoot": True, "BootMode": "Uefi"}
BMC = {"Manager.DateTimeLocalOffset": "+00:00",
       "NetworkProtocol.IPMI.ProtocolEnabled": False,
       "NetworkProtocol.NTP.NTPServers": ["10.0.0.1"],
       "NetworkProtocol.NTP.ProtocolEnabled": True}


def servicing() -> ServicingSettings:
    return ServicingSettings.model_validate({
        "runbooks": {"fix": {"steps": ["bios_settings", "bmc_settings"]}},
        "profiles": {PROFILE: {
            "wave_runbook": "fix",
            "bios": {"ProcTurboMode": "Enabled", "QuietBoot": True},
            "bmc": {"ipmi_over_lan": False, "ntp_servers": ["10.0.0.1"],
                    "time_offset": "+00:00"},
            "firmware": [{"id": "BIOS", "version": "2.1.0",
                          "image": "http://127.0.0.1:1/bios-2.1.0.bin"}]}}})


# name -> (state, BIOS attributes kept, BMC settings kept); None: never read
FLEET: dict[str, tuple[NodeState, dict[str, Any] | None, dict[str, Any] | None]] = {
    "hgx-00": (NodeState.ACTIVE, BIOS, BMC),
    "hgx-01": (NodeState.ACTIVE, {**BIOS, "ProcTurboMode": "Disabled"}, BMC),
    "hgx-02": (NodeState.ACTIVE, BIOS, {**BMC, "NetworkProtocol.IPMI.ProtocolEnabled": True,
                                        "NetworkProtocol.NTP.NTPServers": []}),
    "hgx-03": (NodeState.ACTIVE, None, BMC),
    "hgx-04": (NodeState.SERVICING, {**BIOS, "QuietBoot": False}, BMC),
    "hgx-05": (NodeState.SERVICE_FAILED, BIOS, BMC),
}


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    driver = RedfishDriver(timeout_s=5)

    async def credentials(node: Node) -> BmcCredentials:
        return await store.nodes.credentials(node.id)

    ports = dataclasses.replace(fake_ports(world),
                                servicing=SiteServicing(servicing(), driver, credentials))
    cond = Conductor(store.nodes, ports, LifecycleSettings(auto_inspect=False,
                                                           auto_deploy=False))
    app = make_app(conductor=cond, nodes=store.nodes, tokens=store.tokens, metrics=Metrics(),
                   settings=ApiSettings())
    tokens = {role: (await store.tokens.create(f"{role}-tok", role))[1]
              for role in (Role.VIEWER, Role.OPERATOR)}
    for i, (name, (state, bios, bmc)) in enumerate(FLEET.items()):
        node = await store.nodes.create(NewNode(
            state=state, hostname=name, serial=f"HGX{i:02d}", profile=PROFILE, rack="rack-0",
            macs=(f"02:00:00:00:01:{i:02x}",),
            bmc=BmcEndpoint(driver="redfish", address="127.0.0.1", username="admin",
                            password_set=True), bmc_password="x"), actor="test")
        facts: dict[str, Any] = {FIRMWARE_KEY: FIRMWARE}
        if bios is not None:
            facts[BIOS_KEY] = {"at": AT, "attributes": bios}
        if bmc is not None:
            facts[BMC_KEY] = {"at": AT, "values": bmc}
        await store.nodes.merge_facts(node.id, facts)
    try:
        yield Api(await aiohttp_client(app), store, cond, tokens)
    finally:
        await cond.stop()
        await driver.aclose()


async def test_bios_and_bmc_settings_drift_in_the_api_and_metrics(api: Api) -> None:
    body = (await api.get(DRIFT)).body
    assert body["counts"] == {"conforming": 1, "drifted": 2, "updating": 1, "failed": 1,
                              "unknown": 1}
    nodes = {n["name"]: n for n in body["nodes"]}
    assert [n["name"] for n in body["drifted"]] == ["hgx-01", "hgx-02"]
    assert nodes["hgx-01"]["differences"] == [
        {"component": "ProcTurboMode", "have": "Disabled", "want": "Enabled", "kind": "bios"}]
    assert (nodes["hgx-01"]["firmware_status"], nodes["hgx-01"]["bios_status"],
            nodes["hgx-01"]["bmc_status"]) == ("conforming", "drifted", "conforming")
    assert nodes["hgx-01"]["bios_read_at"] == AT and nodes["hgx-01"]["bmc_read_at"] == AT
    assert nodes["hgx-02"]["differences"] == [
        {"component": "NetworkProtocol.IPMI.ProtocolEnabled", "have": "true",
         "want": "false", "kind": "bmc"},
        {"component": "NetworkProtocol.NTP.NTPServers", "have": "", "want": "10.0.0.1",
         "kind": "bmc"}]
    assert nodes["hgx-03"]["status"] == "unknown" and nodes["hgx-03"]["bios_status"] == \
        "unknown" and nodes["hgx-03"]["bmc_status"] == "conforming"
    assert nodes["hgx-04"]["status"] == "updating"  # its settings are being written
    assert nodes["hgx-05"]["status"] == "failed"
    assert nodes["hgx-00"]["status"] == "conforming" and nodes["hgx-00"]["differences"] == []
    only = (await api.get(f"{DRIFT}?status=drifted")).body
    assert [n["name"] for n in only["nodes"]] == ["hgx-01", "hgx-02"]
    metrics = (await api.get("/metrics", role=None)).text
    assert f'provisioner_firmware_nodes{{profile="{PROFILE}",status="drifted"}} 2.0' in metrics
    for part, status, count in (("bios", "drifted", 1), ("bios", "unknown", 1),
                                ("bmc", "drifted", 1), ("firmware", "conforming", 4),
                                ("firmware", "drifted", 0), ("bmc", "updating", 1)):
        assert (f'provisioner_baseline_nodes{{part="{part}",profile="{PROFILE}",'
                f'status="{status}"}} {count}.0') in metrics, (part, status)


async def test_cli_and_console_name_the_settings(api: Api,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    url = str(api.client.server.make_url("/"))

    def cli(*args: str) -> tuple[int, str]:
        code = main([*args, "--url", url, "--token", api.tokens[Role.VIEWER]])
        return code, capsys.readouterr().out

    code, out = await asyncio.to_thread(cli, "firmware", "drift")
    lines = out.splitlines()
    assert code == 0 and lines[1].split() == [PROFILE, "1", "2", "1", "1", "1"]
    assert lines[3].split() == ["NODE", "PROFILE", "DOMAIN", "KIND", "COMPONENT", "HAVE",
                                "WANT"]
    assert lines[4].split() == ["hgx-01", PROFILE, "-", "bios", "ProcTurboMode", "Disabled",
                                "Enabled"]
    assert lines[5].split() == ["hgx-02", PROFILE, "-", "bmc",
                                "NetworkProtocol.IPMI.ProtocolEnabled", "true", "false"]
    assert lines[6].split() == ["hgx-02", PROFILE, "-", "bmc",
                                "NetworkProtocol.NTP.NTPServers", "(none)", "10.0.0.1"]
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    status, page = await browser.get("/ui/firmware")
    assert status == 200
    elements = Elements(page)
    rows = elements.find("tr", data_hostname="hgx-01")
    assert len(rows) == 1 and len(elements.find("tr", data_hostname="hgx-02")) == 2
    assert elements.find("td", **{"class": "kind-bios"}) and \
        elements.find("td", **{"class": "kind-bmc"})
    text = "".join(elements.text)
    assert "ProcTurboMode" in text and "NetworkProtocol.IPMI.ProtocolEnabled" in text
