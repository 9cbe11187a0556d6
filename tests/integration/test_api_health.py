"""Health findings over the REST API of a real app on the real store: intake from an outside
tool and from Alertmanager's webhook (fixtures: a real v4 notification and one of
dcgm-exporter alerts), a node's findings and the fleet's, silences in the history, roles,
and the ``provisioner_health_findings`` gauge."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli.entry import main
from provisioner.domain import Role
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.integration.test_api import NODES, Api, running_api

FIXTURES = Path(__file__).parents[1] / "fixtures" / "health"
FINDINGS = "/api/v1/health/findings"
ALERTMANAGER = "/api/v1/health/alertmanager"
XID = {"class": "gpu-lost", "action": "restart_os", "subject": "0000:3b:00.0",
       "evidence": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."}


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    async with running_api(aiohttp_client, store, world) as started:
        yield started


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


async def test_post_findings_dedups_lists_and_records(api: Api) -> None:
    node = await api.enroll(hostname="gpu-001", serial="S1")
    first = await api.post(FINDINGS, {"node": "gpu-001", "findings": [XID]})
    assert first.status == 200, first.text
    [result] = first.body["results"]
    assert result["change"] == "opened"
    finding = result["finding"]
    assert (finding["class"], finding["action"], finding["origin"], finding["hostname"]) == (
        "gpu-lost", "restart_os", "external", "gpu-001")
    for _ in range(5):
        again = await api.post(FINDINGS, {"node": "S1", "findings": [XID]})
        assert again.body["results"][0]["change"] == "seen"
    shown = await api.get(f"{NODES}/gpu-001/health")
    assert shown.status == 200 and shown.body["total"] == 1
    assert shown.body["items"][0]["count"] == 6 and shown.body["items"][0]["open"] is True
    history = (await api.get(f"{NODES}/{node['id']}/history")).body["items"]
    assert [(h["event"], h["actor"]) for h in history[1:]] == [
        ("health_finding", "token:operator-tok")]
    assert "gpu-lost (restart_os) 0000:3b:00.0 from external" in history[1]["reason"]
    cleared = await api.post(FINDINGS, {"node": "gpu-001",
                                        "findings": [{**XID, "resolved": True}]})
    assert cleared.body["results"][0]["change"] == "cleared"
    assert (await api.get(f"{NODES}/gpu-001/health")).body["total"] == 0
    assert (await api.get(f"{NODES}/gpu-001/health?all=true")).body["total"] == 1


async def test_intake_needs_the_operator_role_and_valid_bodies(api: Api) -> None:
    await api.enroll(hostname="gpu-001")
    viewer = await api.post(FINDINGS, {"node": "gpu-001", "findings": [XID]}, role=Role.VIEWER)
    assert viewer.status == 403
    assert (await api.post(ALERTMANAGER, fixture(
        "alertmanager-webhook-v4-dcgm-exporter.json"), role=Role.VIEWER)).status == 403
    assert (await api.post(FINDINGS, {"node": "gpu-001", "findings": [XID]},
                           role=None)).status == 401
    for bad in ({"node": "gpu-001", "findings": []},
                {"node": "gpu-001", "findings": [{**XID, "class": "cosmic-ray"}]},
                {"node": "gpu-001", "findings": [XID], "origin": "slurm"}):
        assert (await api.post(FINDINGS, bad)).status == 422, bad
    assert (await api.post(FINDINGS, {"node": "nope", "findings": [XID]})).status == 404
    assert (await api.post(ALERTMANAGER, {"version": "3", "alerts": []})).status == 422
    assert (await api.get(f"{NODES}/nope/health")).status == 404


async def test_alertmanager_webhook_opens_and_clears(api: Api, store: Store) -> None:
    await api.enroll(hostname="gpu-017")  # the alerts name gpu-017.cluster.example:9400
    await api.enroll(hostname="gpu-018")
    earlier = {"class": "gpu-memory", "action": "none", "evidence": "DBE",
               "subject": "UUID=GPU-7d2e1f0a-9c8b-4a3e-8f7d-6c5b4a392817"}
    payload = fixture("alertmanager-webhook-v4-dcgm-exporter.json")
    firing_ecc = json.loads(json.dumps(payload))
    firing_ecc["alerts"] = [dict(payload["alerts"][1], status="firing")]
    opened = await api.post(ALERTMANAGER, firing_ecc)
    assert opened.status == 200 and opened.body["firing"] == 1
    reply = await api.post(ALERTMANAGER, payload)
    assert reply.status == 200, reply.text
    assert reply.body == {"received": 3, "firing": 2, "resolved": 1, "unknown_nodes": [],
                          "skipped": 0}
    fleet = (await api.get(f"{FINDINGS}?origin=alertmanager")).body
    assert sorted((f["hostname"], f["class"], f["action"]) for f in fleet["items"]) == [
        ("gpu-017", "gpu-lost", "restart_os"), ("gpu-018", "thermal", "drain")]
    every = (await api.get(f"{FINDINGS}?origin=alertmanager&all=true")).body["items"]
    [ecc] = [f for f in every if f["class"] == earlier["class"]]
    assert ecc["subject"] == earlier["subject"] and ecc["open"] is False
    assert (await api.get(f"{FINDINGS}?class=thermal")).body["total"] == 1
    assert (await api.get(f"{FINDINGS}?node=gpu-017")).body["total"] == 1
    # a real notification about a machine that is not ours: nothing recorded, named back
    real = await api.post(ALERTMANAGER, fixture(
        "alertmanager-webhook-v4-resolved-kube-state-metrics.json"))
    assert real.body["unknown_nodes"] == ["192.168.69.53"] and real.body["resolved"] == 0


async def test_silence_is_in_the_history_and_the_gauge(api: Api) -> None:
    node = await api.enroll(hostname="gpu-001")
    await api.post(FINDINGS, {"node": "gpu-001", "findings": [
        XID, {"class": "thermal", "evidence": "GPU 1 at 95 C", "subject": "GPU 1"}]})
    metrics = (await api.get("/metrics", role=None)).text
    assert 'provisioner_health_findings{class="thermal"} 1.0' in metrics
    assert 'provisioner_health_findings{class="gpu-lost"} 1.0' in metrics
    reply = await api.post(f"{NODES}/gpu-001/health/silence", {
        "class": "thermal", "duration_s": 7200, "reason": "fan swap booked for Tuesday"})
    assert reply.status == 200, reply.text
    [silenced] = reply.body["items"]
    assert silenced["silenced"] is True and silenced["silenced_by"] == "token:operator-tok"
    metrics = (await api.get("/metrics", role=None)).text
    assert 'provisioner_health_findings{class="thermal"} 0.0' in metrics
    assert 'provisioner_health_findings{class="gpu-lost"} 1.0' in metrics
    last = (await api.get(f"{NODES}/{node['id']}/history")).body["items"][-1]
    assert last["event"] == "health_silenced" and last["actor"] == "token:operator-tok"
    assert last["reason"].endswith("fan swap booked for Tuesday")
    for bad in ({"duration_s": 7200, "reason": "x"},  # neither class nor finding
                {"class": "thermal", "finding_id": 1, "duration_s": 7200, "reason": "x"},
                {"class": "thermal", "duration_s": 7200, "reason": ""},
                {"class": "thermal", "duration_s": 10, "reason": "x"}):
        assert (await api.post(f"{NODES}/gpu-001/health/silence", bad)).status == 422, bad
    assert (await api.post(f"{NODES}/gpu-001/health/silence", {
        "finding_id": 999, "duration_s": 600, "reason": "x"})).status == 404


async def test_openapi_documents_the_health_routes(api: Api) -> None:
    paths = (await api.get("/openapi.json", role=None)).body["paths"]
    for path in (FINDINGS, ALERTMANAGER, "/api/v1/nodes/{id}/health",
                 "/api/v1/nodes/{id}/health/silence"):
        assert path in paths, path


async def test_cli_lists_and_silences(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    await api.enroll(hostname="gpu-001")
    await api.post(FINDINGS, {"node": "gpu-001", "findings": [XID]})
    url = str(api.client.server.make_url("/"))

    def cli(*args: str, role: Role = Role.OPERATOR) -> tuple[int, str]:
        code = main([*args, "--url", url, "--token", api.tokens[role]])
        return code, capsys.readouterr().out

    code, out = await asyncio.to_thread(cli, "node", "health", "gpu-001", role=Role.VIEWER)
    header, row = out.splitlines()
    assert code == 0 and header.split()[:4] == ["ID", "NODE", "CLASS", "ACTION"]
    assert row.split()[1:6] == ["gpu-001", "gpu-lost", "restart_os", "external", "0000:3b:00.0"]
    code, out = await asyncio.to_thread(cli, "health", "silence", "gpu-001", "--class",
                                        "gpu-lost", "--for", "2h", "--reason", "RMA 4411")
    assert code == 0 and out.startswith("gpu-001: silenced until ") and "(1 findings" in out
    code, out = await asyncio.to_thread(cli, "health", "list", "--class", "gpu-lost",
                                        role=Role.VIEWER)
    assert code == 0 and "silenced until" in out.splitlines()[1]
