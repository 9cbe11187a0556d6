"""The fleet's health in the console (``/ui/health``) and the time-to-detect and time-to-repair
histograms on ``/metrics``, through the real app (real socket, store, simulated machines):
an Alertmanager alert (``startsAt`` 40 s ago) walks a node's ladder to ``service_required``;
an operator's ladder stopped at its first rung; a finding with nothing to repair."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from provisioner.api.app import make_app
from provisioner.config import ApiSettings, LifecycleSettings
from provisioner.config.health import HealthSettings
from provisioner.domain import BmcEndpoint, NewNode, Node, Role
from provisioner.health.model import Action, Finding, HealthClass, Source
from provisioner.health.records import Origin, Report
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.repair import RepairService, ladder_listener, repair_timer
from provisioner.lifecycle.states import NodeState
from provisioner.metrics import Metrics
from provisioner.simulation.drivers import FAULT, simulated_facts
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state
from tests.integration.test_api import Api
from tests.integration.test_console import Browser, Elements

S = NodeState


async def sim_node(store: Store, world: SimWorld, name: str, serial: str) -> Node:
    node = await store.nodes.create(NewNode(
        state=S.ACTIVE, hostname=name, serial=serial, profile="gpu",
        bmc=BmcEndpoint(driver="fake", address=serial), bmc_password="pw"), actor="test")
    await store.nodes.merge_facts(node.id, simulated_facts(serial, serial))
    await world.ensure(serial, "boot", "power", "on")
    return node


def sample(metrics: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^{name}\{{{re.escape(wanted)}\}} (\S+)$", metrics, re.M)
    assert found, f"{name}{{{wanted}}} not in /metrics"
    return float(found[1])


async def test_console_health_page_and_repair_histograms(
        aiohttp_client: Any, store: Store, world: SimWorld) -> None:
    metrics = Metrics()
    conductor = Conductor(store.nodes, fake_ports(world),
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))
    conductor.add_observer(repair_timer(metrics.observe_repair))  # as the daemon wires it
    repairs = RepairService(conductor, store.nodes, HealthSettings(max_repairing_fraction=1.0))
    health = HealthFindings(store.findings, conductor, detected=metrics.observe_detect)
    health.add_listener(ladder_listener(repairs))
    app = make_app(conductor=conductor, nodes=store.nodes, tokens=store.tokens,
                   metrics=metrics, settings=ApiSettings(), repairs=repairs, health=health)
    tokens = {role: (await store.tokens.create(f"{role}-tok", role))[1]
              for role in (Role.VIEWER, Role.OPERATOR)}
    api = Api(await aiohttp_client(app), store, conductor, tokens)
    broken = await sim_node(store, world, "gpu-h1", "H1")
    stopped = await sim_node(store, world, "gpu-h2", "H2")
    noted = await sim_node(store, world, "gpu-h3", "H3")
    await world.ensure("H1", "inject", FAULT, "never")
    try:
        starts = (datetime.now(UTC) - timedelta(seconds=40)).isoformat().replace("+00:00", "Z")
        posted = await api.post("/api/v1/health/alertmanager", {
            "version": "4", "status": "firing", "alerts": [{
                "status": "firing", "startsAt": starts,
                "labels": {"alertname": "GpuXid79", "node": "gpu-h1", "xid": "79",
                           "gpu": "0000:18:00"},
                "annotations": {"summary": "GPU has fallen off the bus"}}]})
        assert posted.status == 200, posted.text
        stuck = await wait_for_state(store, broken.id, S.SERVICE_REQUIRED)
        assert stuck.last_error.startswith("out of rungs")
        await repairs.start(stopped.id, Finding(HealthClass.GPU_MEMORY, Action.RESET_GPU,
                                                "Xid 48: DBE", Source.KERNEL_LOG, "GPU 1"),
                            actor="op")
        await repairs.stop(stopped.id, actor="op", reason="look first")
        await health.report(noted.id, Origin.EXTERNAL, [Report(
            HealthClass.APPLICATION, Action.NONE, "Xid 13: graphics engine exception")],
            actor="test")

        browser = Browser(api)
        await browser.sign_in(Role.VIEWER)
        status, text = await browser.get("/ui/health")
        assert status == 200, text
        page = Elements(text)
        assert {a["data-hostname"] for a in page.find("tr", data_class="gpu-lost")} == {
            "gpu-h1"}
        assert page.find("tr", data_hostname="gpu-h3", data_class="application")
        [ladder] = page.find("tr", data_hostname="gpu-h2", data_state="repair_failed")
        assert ladder["data-rung"] == "reset_gpu"
        service = text[text.index('aria-label="Service required"'):]
        assert 'data-hostname="gpu-h1"' in service and "H1" in service
        for rung in ("restart_os", "power_cycle"):  # XID 79's action: restart_os on
            assert f"{rung}: failed" in service
        assert "GPU has fallen off the bus" in service
        assert "NVIDIA H100 80GB HBM3 0000:18:00.0" in service  # the part to replace
        assert 'href="/ui/health"' in text  # in the navigation

        async with api.client.get("/metrics") as resp:
            scraped = await resp.text()
        assert sample(scraped, "provisioner_health_time_to_detect_seconds_count",
                      source="alertmanager") == 1
        assert 40 <= sample(scraped, "provisioner_health_time_to_detect_seconds_sum",
                            source="alertmanager") < 60
        assert 'source="external"' not in scraped  # the API's report named no time
        assert sample(scraped, "provisioner_health_time_to_repair_seconds_count",
                      outcome="service_required") == 1
        assert 'outcome="passed"' not in scraped  # the stopped ladder has not ended
    finally:
        await conductor.stop()
