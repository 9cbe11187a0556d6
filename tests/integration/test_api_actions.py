"""Node actions, history and metrics through the REST API (real socket, store, fake drivers)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from provisioner.domain import Role
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import wait_for_state
from tests.integration.test_api import NODES, Api, running_api


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    async with running_api(aiohttp_client, store, world) as started:
        yield started


def _action(node: dict[str, Any], action: str) -> str:
    return f"{NODES}/{node['id']}/actions/{action}"


async def test_inspect_drives_an_enrolled_node_to_inspected(api: Api) -> None:
    node = await api.enroll(serial="SN-I", hostname="gpu-i",
                            bmc={"driver": "fake", "address": "gpu-i-bmc"})
    reply = await api.post(_action(node, "inspect"), {"reason": "first look"})
    assert reply.status == 202
    assert reply.body["state"] == "inspecting"
    done = await wait_for_state(api.store, node["id"], NodeState.INSPECTED)
    assert done.facts
    detail = (await api.get(f"{NODES}/gpu-i")).body
    assert detail["state"] == "inspected" and detail["facts"] == done.facts
    assert detail["step_status"] is None
    assert detail["allowed_actions"] == ["inspect", "deploy", "retire", "register-running",
                                         "maintenance-on"]


async def test_invalid_transition_is_409_naming_state_and_allowed_events(api: Api) -> None:
    node = await api.enroll(serial="SN-T")
    reply = await api.post(_action(node, "deploy"))
    assert reply.status == 409
    problem = reply.body
    assert problem["type"] == "invalid-transition"
    assert problem["state"] == "enrolled"
    assert problem["allowed_events"] == ["inspect", "register_running", "retire"]
    assert "enrolled" in problem["detail"] and "inspect" in problem["detail"]
    assert (await api.get(f"{NODES}/{node['id']}")).body["state"] == "enrolled"


async def test_unknown_action_is_404_listing_the_valid_ones(api: Api) -> None:
    node = await api.enroll(serial="SN-U")
    reply = await api.post(_action(node, "explode"))
    assert reply.status == 404
    for action in ("inspect", "deploy", "retire", "retry", "abort", "maintenance-on",
                   "maintenance-off"):
        assert action in reply.body["detail"]


async def test_action_on_unknown_node_is_404(api: Api) -> None:
    reply = await api.post(f"{NODES}/no-such-node/actions/inspect")
    assert reply.status == 404


@pytest.mark.parametrize("body", [None, {}, {"reason": ""}, {"reason": "   "}],
                         ids=["no-body", "empty-object", "empty-reason", "blank-reason"])
async def test_maintenance_on_without_reason_is_422(api: Api, body: object) -> None:
    node = await api.enroll(serial="SN-M")
    reply = await api.post(_action(node, "maintenance-on"), body)
    assert reply.status == 422
    assert "reason" in reply.body["detail"]


async def test_maintenance_blocks_work_until_turned_off(api: Api) -> None:
    node = await api.enroll(serial="SN-MM")
    reply = await api.post(_action(node, "maintenance-on"), {"reason": "reseat GPU 3"})
    assert reply.status == 202
    assert reply.body["maintenance"] is True
    assert reply.body["maintenance_reason"] == "reseat GPU 3"
    detail = (await api.get(f"{NODES}/{node['id']}")).body
    assert detail["allowed_actions"] == ["retire", "register-running", "maintenance-off"]
    blocked = await api.post(_action(node, "inspect"))
    assert blocked.status == 409
    assert "maintenance" in blocked.body["detail"]
    off = await api.post(_action(node, "maintenance-off"))
    assert off.status == 202 and off.body["maintenance"] is False
    assert off.body["maintenance_reason"] == ""
    assert (await api.post(_action(node, "inspect"))).status == 202
    await wait_for_state(api.store, node["id"], NodeState.INSPECTED)


async def test_action_body_errors(api: Api) -> None:
    node = await api.enroll(serial="SN-B")
    bad_json = await api.call("POST", _action(node, "inspect"), data=b"{",
                              headers={"Content-Type": "application/json"})
    assert bad_json.status == 400
    unknown = await api.post(_action(node, "inspect"), {"reason": "x", "force": True})
    assert unknown.status == 422 and unknown.body["errors"][0]["loc"] == "force"
    too_long = await api.post(_action(node, "inspect"), {"reason": "x" * 2000})
    assert too_long.status == 422 and too_long.body["errors"][0]["loc"] == "reason"


async def test_retire_then_history_records_every_step_with_actor(api: Api) -> None:
    node = await api.enroll(serial="SN-H", hostname="gpu-h")
    await api.post(_action(node, "maintenance-on"), {"reason": "rma"})
    await api.post(_action(node, "maintenance-off"))
    await api.post(_action(node, "retire"), {"reason": "end of life"})
    await wait_for_state(api.store, node["id"], NodeState.RETIRED)
    reply = await api.get(f"{NODES}/gpu-h/history")
    assert reply.status == 200
    items = reply.body["items"]
    assert [item["seq"] for item in items] == list(range(1, len(items) + 1))
    erased = [i for i in items if i["event"] == "disk_erased"]  # one per disk, while retiring
    assert erased and all((i["from_state"], i["to_state"]) == ("retiring", "retiring")
                          for i in erased)
    items = [i for i in items if i["event"] != "disk_erased"]
    assert [(i["event"], i["from_state"], i["to_state"]) for i in items] == [
        ("enroll", "", "enrolled"),
        ("maintenance_on", "enrolled", "enrolled"),
        ("maintenance_off", "enrolled", "enrolled"),
        ("retire", "enrolled", "retiring"),
        ("done", "retiring", "retired"),
    ]
    operator = "token:operator-tok"
    assert [item["actor"] for item in items] == [operator] * 4 + ["conductor"]
    assert items[1]["reason"] == "rma" and items[3]["reason"] == "end of life"
    assert all(item["at"] for item in items)


async def test_abort_in_flight_then_retry(aiohttp_client: Any, store: Store,
                                          world: SimWorld) -> None:
    async with running_api(aiohttp_client, store, world, delay_s=0.2) as api:
        node = await api.enroll(serial="SN-AB", bmc={"driver": "fake", "address": "ab-bmc"})
        assert (await api.post(_action(node, "inspect"))).status == 202
        await api.post(_action(node, "maintenance-on"), {"reason": "hold it"})
        await _wait_for_step_status(api, "SN-AB", "held")
        aborted = await api.post(_action(node, "abort"), {"reason": "wrong rack"})
        assert aborted.status == 202
        assert aborted.body["state"] == "inspect_failed"
        assert aborted.body["last_error"] == "wrong rack"
        refused = await api.post(_action(node, "retry"))
        assert refused.status == 409 and "maintenance" in refused.body["detail"]
        await api.post(_action(node, "maintenance-off"))
        retried = await api.post(_action(node, "retry"))
        assert retried.status == 202 and retried.body["state"] == "inspecting"
        done = await wait_for_state(store, node["id"], NodeState.INSPECTED)
        assert done.last_error == ""
        assert (await api.post(_action(node, "abort"))).status == 409


async def _wait_for_step_status(api: Api, key: str, status: str) -> None:
    for _ in range(500):
        if (await api.get(f"{NODES}/{key}")).body["step_status"] == status:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"node {key} never reached step status {status}")


async def test_metrics_count_nodes_and_transitions(api: Api) -> None:
    node = await api.enroll(serial="SN-MET")
    await api.enroll(serial="SN-MET2")
    await api.post(_action(node, "inspect"))
    await wait_for_state(api.store, node["id"], NodeState.INSPECTED)
    await api.get(f"{NODES}?limit=1")
    reply = await api.get("/metrics", role=None)
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain")
    text = reply.text
    assert _sample(text, 'provisioner_nodes{state="enrolled"}') == 1.0
    assert _sample(text, 'provisioner_nodes{state="inspected"}') == 1.0
    assert _sample(text, 'provisioner_nodes{state="active"}') == 0.0
    assert _sample(text, 'provisioner_transitions_total{event="inspect",'
                         'from_state="enrolled",to_state="inspecting"}') == 1.0
    assert _sample(text, 'provisioner_transitions_total{event="done",'
                         'from_state="inspecting",to_state="inspected"}') == 1.0
    assert 'provisioner_api_request_seconds_count{method="GET",route="/api/v1/nodes",' \
           'status="200"}' in text
    assert SECRET_FREE.search(text) is None


SECRET_FREE = re.compile(r"SN-MET|token")


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in metrics")


async def test_agent_token_may_not_use_the_api(api: Api) -> None:
    node = await api.enroll(serial="SN-AG")
    reply = await api.post(_action(node, "inspect"), role=Role.AGENT)
    assert reply.status == 403
