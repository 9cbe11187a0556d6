"""The repair ladder through the REST API: an operator starts, skips, stops and reads it; the
circuit breaker's state and reset (real socket, store, simulated machines)."""

from __future__ import annotations

from typing import Any

from provisioner.api.app import make_app
from provisioner.config import ApiSettings, LifecycleSettings
from provisioner.config.health import HealthSettings
from provisioner.domain import BmcEndpoint, NewNode, Role
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.repair import RepairService
from provisioner.lifecycle.states import NodeState
from provisioner.metrics import Metrics
from provisioner.simulation.drivers import FAULT, simulated_facts
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state
from tests.integration.test_api import NODES, Api


async def test_operator_drives_the_ladder(aiohttp_client: Any, store: Store,
                                          world: SimWorld) -> None:
    conductor = Conductor(store.nodes, fake_ports(world, delay_s=0.2),
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))
    repairs = RepairService(conductor, store.nodes, HealthSettings())
    app = make_app(conductor=conductor, nodes=store.nodes, tokens=store.tokens,
                   metrics=Metrics(), settings=ApiSettings(), repairs=repairs)
    tokens = {role: (await store.tokens.create(f"{role}-tok", role))[1]
              for role in (Role.VIEWER, Role.OPERATOR, Role.ADMIN, Role.AGENT)}
    api = Api(await aiohttp_client(app), store, conductor, tokens)
    node = await store.nodes.create(NewNode(
        state=NodeState.ACTIVE, hostname="gpu-r1", serial="R1", profile="gpu",
        bmc=BmcEndpoint(driver="fake", address="R1"), bmc_password="pw"), actor="test")
    await store.nodes.merge_facts(node.id, simulated_facts("R1", "R1"))
    await world.ensure("R1", "inject", FAULT, "never")
    try:
        assert (await api.post(f"{NODES}/gpu-r1/repair", {"class": "gpu-memory"},
                               role=Role.VIEWER)).status == 403
        unknown = await api.post(f"{NODES}/gpu-r1/repair", {"class": "gremlins"})
        assert unknown.status == 422 and "gremlins" in unknown.body["detail"]
        started = await api.post(f"{NODES}/gpu-r1/repair", {
            "class": "gpu-memory", "action": "reset_gpu", "subject": "GPU 2",
            "evidence": "Xid 48: DBE", "reason": "ticket 42"})
        assert started.status == 202 and started.body["outcome"] == "started"
        assert started.body["node"]["state"] == "repairing"
        skipped = await api.post(f"{NODES}/gpu-r1/repair/skip", {"rung": "power_cycle"})
        assert skipped.status == 200
        stuck = await wait_for_state(store, node.id, NodeState.SERVICE_REQUIRED)
        record = (await api.get(f"{NODES}/gpu-r1/repair")).body["record"]
        assert record["outcome"] == "service_required" and record["serial"] == "R1"
        assert record["parts"][0]["pci_address"] == "0000:38:00.0"
        assert [(r["rung"], r["result"].split(":")[0]) for r in record["tried"]] == [
            ("reset_gpu", "failed"), ("restart_os", "failed"), ("power_cycle", "skipped")]
        assert "out of rungs" in stuck.last_error
        listed = (await api.get(f"{NODES}?state=service_required")).body
        assert [n["hostname"] for n in listed["items"]] == ["gpu-r1"]
        stop = await api.post(f"{NODES}/gpu-r1/repair/stop", {"reason": "x"})
        assert stop.status == 409  # no ladder runs
        breaker = (await api.get("/api/v1/health/breaker")).body
        assert breaker == {"tripped": False, "reason": "", "since": "", "held": []}
        reset = await api.post("/api/v1/health/breaker/reset", {"reason": "drill"})
        assert reset.status == 200 and reset.body["tripped"] is False
    finally:
        await conductor.stop()
