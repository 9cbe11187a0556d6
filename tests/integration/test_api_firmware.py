"""Firmware drift and waves through the REST API, the CLI, /metrics and the console, over one
simulated NVL72 domain (18 trays: most drifted, two at the baseline, one never read)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from provisioner.api.app import make_app
from provisioner.bmc.redfish import RedfishDriver
from provisioner.cli.entry import main
from provisioner.config import ApiSettings
from provisioner.domain import Role
from provisioner.lifecycle.service_step import FIRMWARE_KEY
from provisioner.lifecycle.waves import WaveDriver
from provisioner.metrics import Metrics
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.integration.fleet_firmware import PROFILE, clique, conductor, make_fleet
from tests.integration.test_api import Api
from tests.integration.test_console import Browser, Elements

DRIFT = "/api/v1/firmware/drift"
WAVES = "/api/v1/firmware/waves"


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    driver = RedfishDriver(timeout_s=5)
    cond = conductor(store, world, driver)
    app = make_app(conductor=cond, nodes=store.nodes, tokens=store.tokens, metrics=Metrics(),
                   settings=ApiSettings(),
                   waves=WaveDriver(store.waves, store.nodes, cond, interval_s=0.05))
    tokens = {role: (await store.tokens.create(f"{role}-tok", role))[1]
              for role in (Role.VIEWER, Role.OPERATOR, Role.ADMIN)}
    nodes = await make_fleet(store, world, 1)
    at_baseline = [{"id": "BIOS", "name": "BIOS", "version": "1.2.0", "updateable": True},
                   {"id": "BMC", "name": "BMC", "version": "25.04.1", "updateable": True}]
    for node in nodes[:2]:
        await store.nodes.merge_facts(node.id, {FIRMWARE_KEY: {
            "at": "2026-11-27T11:00:00+00:00", "components": at_baseline}})
    await store.nodes.merge_facts(nodes[-1].id, {FIRMWARE_KEY: None})  # never read
    try:
        yield Api(await aiohttp_client(app), store, cond, tokens)
    finally:
        await cond.stop()
        await driver.aclose()


async def test_drift_counts_filters_and_the_drifted_components(api: Api) -> None:
    body = (await api.get(DRIFT)).body
    assert body["counts"] == {"conforming": 2, "drifted": 15, "updating": 0, "failed": 0,
                              "unknown": 1}
    assert body["profiles"] == {PROFILE: body["counts"]}
    assert len(body["drifted"]) == 15 and len(body["nodes"]) == 18
    first = body["drifted"][0]
    assert first["name"] == "nvl00-t02" and first["domain"] == clique(0)
    assert first["rack"] == "rack-00" and first["state"] == "active"
    assert first["differences"] == [{"component": "BIOS", "have": "1.0.0", "want": "1.2.0",
                                     "kind": "firmware"}]
    assert first["firmware_status"] == "drifted" and first["bios_status"] is None
    unknown = (await api.get(f"{DRIFT}?status=unknown")).body
    assert [n["name"] for n in unknown["nodes"]] == ["nvl00-t17"]
    both = (await api.get(f"{DRIFT}?domain={clique(0)}&status=conforming")).body
    assert [n["name"] for n in both["nodes"]] == ["nvl00-t00", "nvl00-t01"]
    assert (await api.get(f"{DRIFT}?rack=rack-99")).body["nodes"] == []
    assert (await api.get(f"{DRIFT}?profile=other")).body["counts"]["drifted"] == 0
    assert (await api.get(f"{DRIFT}?status=sideways")).status == 422
    metrics = (await api.get("/metrics", role=None)).text
    assert f'provisioner_firmware_nodes{{profile="{PROFILE}",status="drifted"}} 15.0' in metrics
    assert f'provisioner_firmware_nodes{{profile="{PROFILE}",status="unknown"}} 1.0' in metrics


async def test_waves_are_started_read_and_stopped(api: Api) -> None:
    start = {"profile": PROFILE, "max_nodes": 2, "max_domain_share": 0.25,
             "stop_after_failures": 2}
    assert (await api.post(WAVES, start, role=Role.VIEWER)).status == 403
    unknown = await api.post(WAVES, {**start, "runbook": "nope"})
    assert unknown.status == 422 and "unknown runbook 'nope'" in unknown.body["detail"]
    no_update = await api.post(WAVES, {**start, "runbook": "inventory"})
    assert no_update.status == 422 and "no firmware_update step" in no_update.body["detail"]
    assert (await api.post(WAVES, {**start, "max_domain_share": 0})).status == 422
    started = await api.post(WAVES, start)
    assert started.status == 201, started.text
    wave = started.body
    assert wave["status"] == "running" and wave["runbook"] == "fw"
    assert wave["counts"] == {"pending": 15} and wave["started_by"] == "token:operator-tok"
    again = await api.post(WAVES, start)
    assert again.status == 409 and "has a running firmware wave" in again.body["detail"]
    shown = (await api.get(f"{WAVES}/{wave['id']}")).body
    assert [n["name"] for n in shown["nodes"]][:2] == ["nvl00-t02", "nvl00-t03"]
    assert (await api.get(f"{WAVES}/no-such-wave")).status == 404
    listed = (await api.get(WAVES)).body["items"]
    assert [w["id"] for w in listed] == [wave["id"]]
    stopped = await api.post(f"{WAVES}/{wave['id']}/stop")
    assert stopped.status == 200 and stopped.body["status"] == "stopped"
    assert stopped.body["reason"] == "stopped by token:operator-tok"


async def test_cli_and_console(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(api.client.server.make_url("/"))

    def cli(*args: str, role: Role = Role.OPERATOR) -> tuple[int, str]:
        code = main([*args, "--url", url, "--token", api.tokens[role]])
        return code, capsys.readouterr().out

    code, out = await asyncio.to_thread(cli, "firmware", "drift", role=Role.VIEWER)
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["PROFILE", "CONFORMING", "DRIFTED", "UPDATING",
                                              "FAILED", "UNKNOWN"]
    assert lines[1].split() == [PROFILE, "2", "15", "0", "0", "1"]
    assert lines[4].split() == ["nvl00-t02", PROFILE, clique(0), "firmware", "BIOS", "1.0.0",
                                "1.2.0"]
    code, out = await asyncio.to_thread(cli, "firmware", "drift", "--status", "unknown",
                                        "--json", role=Role.VIEWER)
    assert code == 0 and '"name": "nvl00-t17"' in out
    code, out = await asyncio.to_thread(
        cli, "firmware", "wave", "start", "--profile", PROFILE, "--max-nodes", "3",
        "--max-domain-share", "0.2", "--stop-after-failures", "2")
    found = re.match(r"wave (\S+): profile gb200, runbook fw, running", out)
    assert code == 0 and found, out
    assert "3 at once, 0.2 of a domain" in out and "pending 15" in out
    code, out = await asyncio.to_thread(cli, "firmware", "wave", "status", role=Role.VIEWER)
    assert code == 0 and out.splitlines()[1].split()[:3] == [found[1], PROFILE, "running"]
    code, out = await asyncio.to_thread(cli, "firmware", "wave", "stop", found[1])
    assert code == 0 and f"wave {found[1]}: profile gb200, runbook fw, stopped" in out
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    status, page = await browser.get("/ui/firmware")
    assert status == 200
    elements = Elements(page)
    counts = {a["data-status"]: None for a in elements.find("td") if "data-status" in a}
    assert set(counts) == {"conforming", "drifted", "updating", "failed", "unknown"}
    assert len(elements.find("tr", data_hostname="nvl00-t02")) == 1
    assert elements.find("tr", data_wave=found[1], data_status="stopped")
    text = "".join(elements.text)
    assert "nvl00-t02" in text and "1.0.0" in text
