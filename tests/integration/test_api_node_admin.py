"""Node edit, delete, replace and bulk actions through the REST API (issue 30): a real socket,
store and conductor with the fake drivers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from provisioner.domain import NewNode, Role
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import wait_for_state
from tests.integration.test_api import NODES, Api, running_api


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    async with running_api(aiohttp_client, store, world) as started:
        yield started


async def _retired(api: Api, **fields: object) -> dict[str, Any]:
    node = await api.enroll(**fields)
    reply = await api.post(f"{NODES}/{node['id']}/actions/retire", {"reason": "rma"})
    assert reply.status == 202, reply.text
    await wait_for_state(api.store, node["id"], NodeState.RETIRED)
    return node


async def _active(api: Api, hostname: str) -> str:
    node = await api.store.nodes.create(NewNode(
        state=NodeState.ACTIVE, hostname=hostname, serial=f"SN-{hostname}", profile="gpu",
        rack="r1"), actor="test")
    return str(node.id)


async def test_patch_edits_fields_with_one_history_row_each(api: Api) -> None:
    node = await api.enroll(hostname="gpu-e1", serial="SN-E1", rack="r1")
    reply = await api.call("PATCH", f"{NODES}/gpu-e1", body={
        "rack": "r12", "position": "u7", "profile": "h100", "reason": "moved"})
    assert reply.status == 200, reply.text
    assert (reply.body["rack"], reply.body["position"], reply.body["profile"]) == \
        ("r12", "u7", "h100")
    history = (await api.get(f"{NODES}/{node['id']}/history")).body["items"]
    edits = [entry for entry in history if entry["event"] == "edit"]
    assert [entry["reason"] for entry in edits] == [
        "position (none) -> 'u7': moved", "profile (none) -> 'h100': moved",
        "rack 'r1' -> 'r12': moved"]
    assert {entry["actor"] for entry in edits} == {"token:operator-tok"}
    cleared = await api.call("PATCH", f"{NODES}/gpu-e1", body={"position": None})
    assert cleared.status == 200 and cleared.body["position"] is None
    same = await api.call("PATCH", f"{NODES}/gpu-e1", body={"rack": "r12"})
    assert same.status == 200
    after = (await api.get(f"{NODES}/{node['id']}/history")).body["items"]
    assert len(after) == len(history) + 1  # the clear wrote a row, the no-op none


async def test_patch_rename_of_active_node_needs_force(api: Api) -> None:
    node_id = await _active(api, "gpu-live")
    refused = await api.call("PATCH", f"{NODES}/gpu-live", body={"hostname": "gpu-new"})
    assert refused.status == 409
    assert "active" in refused.body["detail"] and "force" in refused.body["detail"]
    reprofile = await api.call("PATCH", f"{NODES}/gpu-live", body={"profile": "other"})
    assert reprofile.status == 409
    rack = await api.call("PATCH", f"{NODES}/gpu-live", body={"rack": "r9"})
    assert rack.status == 200 and rack.body["rack"] == "r9"
    forced = await api.call("PATCH", f"{NODES}/gpu-live",
                            body={"hostname": "gpu-new", "force": True})
    assert forced.status == 200 and forced.body["hostname"] == "gpu-new"
    assert (await api.get(f"{NODES}/{node_id}")).body["hostname"] == "gpu-new"


async def test_patch_rejects_bad_bodies(api: Api) -> None:
    await api.enroll(hostname="gpu-b", serial="SN-B")
    other = await api.enroll(hostname="gpu-c", serial="SN-C")
    empty = await api.call("PATCH", f"{NODES}/gpu-b", body={})
    assert empty.status == 422
    serial = await api.call("PATCH", f"{NODES}/gpu-b", body={"serial": "X"})
    assert serial.status == 422 and serial.body["errors"][0]["loc"] == "serial"
    taken = await api.call("PATCH", f"{NODES}/gpu-b", body={"hostname": "gpu-c"})
    assert taken.status == 409 and "hostname" in taken.body["detail"]
    viewer = await api.call("PATCH", f"{NODES}/gpu-b", body={"rack": "r1"}, role=Role.VIEWER)
    assert viewer.status == 403
    assert other["hostname"] == "gpu-c"


async def test_delete_only_a_retired_node_and_export_its_history(api: Api) -> None:
    live = await api.enroll(hostname="gpu-d1", serial="SN-D1")
    refused = await api.call("DELETE", f"{NODES}/gpu-d1", role=Role.ADMIN)
    assert refused.status == 409 and "enrolled" in refused.body["detail"]
    operator = await api.call("DELETE", f"{NODES}/gpu-d1")
    assert operator.status == 403
    node = await _retired(api, hostname="gpu-d2", serial="SN-D2",
                          macs=["52:54:00:dd:00:02"])
    reply = await api.call("DELETE", f"{NODES}/gpu-d2", role=Role.ADMIN)
    assert reply.status == 200, reply.text
    assert reply.body["node"]["id"] == node["id"]
    assert [e["event"] for e in reply.body["history"]][:2] == ["enroll", "retire"]
    assert (await api.get(f"{NODES}/{node['id']}")).status == 404
    again = await api.enroll(hostname="gpu-d2", serial="SN-D2", macs=["52:54:00:dd:00:02"])
    assert again["id"] != node["id"]  # hostname, serial and MAC are free again
    assert (await api.get(f"{NODES}/{live['id']}")).status == 200


async def test_replace_moves_name_and_place_and_links_histories(api: Api) -> None:
    old = await _retired(api, hostname="gpu-r7", serial="SN-OLD", rack="r7", position="u3",
                         profile="h100", macs=["52:54:00:77:00:01"])
    new = await api.enroll(serial="SN-NEW", macs=["52:54:00:77:00:02"])
    reply = await api.post(f"{NODES}/gpu-r7/replace", {"with": "SN-NEW", "reason": "RMA 42"})
    assert reply.status == 200, reply.text
    moved = reply.body["new"]
    assert (moved["id"], moved["hostname"], moved["rack"], moved["position"],
            moved["profile"]) == (new["id"], "gpu-r7", "r7", "u3", "h100")
    freed = reply.body["old"]
    assert (freed["hostname"], freed["serial"], freed["macs"]) == (None, None, [])
    old_history = (await api.get(f"{NODES}/{old['id']}/history")).body["items"]
    new_history = (await api.get(f"{NODES}/{new['id']}/history")).body["items"]
    assert old_history[-1]["event"] == "replaced_by" and new["id"] in old_history[-1]["reason"]
    assert new_history[-1]["event"] == "replaces" and old["id"] in new_history[-1]["reason"]
    assert "RMA 42" in new_history[-1]["reason"]
    detail = (await api.get(f"{NODES}/{old['id']}")).body
    assert detail["facts"]["replaced_by"] == {"node": new["id"], "hostname": "gpu-r7",
                                              "serial": "SN-OLD",
                                              "macs": ["52:54:00:77:00:01"]}
    reused = await api.enroll(serial="SN-OLD", macs=["52:54:00:77:00:01"])
    assert reused["serial"] == "SN-OLD"


async def test_replace_refuses_a_live_old_or_new_node(api: Api) -> None:
    await api.enroll(hostname="gpu-x1", serial="SN-X1")
    await _active(api, "gpu-x2")
    await _retired(api, hostname="gpu-x3", serial="SN-X3")
    not_retired = await api.post(f"{NODES}/gpu-x1/replace", {"with": "gpu-x3"})
    assert not_retired.status == 409 and "enrolled" in not_retired.body["detail"]
    active_new = await api.post(f"{NODES}/gpu-x3/replace", {"with": "gpu-x2"})
    assert active_new.status == 409 and "active" in active_new.body["detail"]
    missing = await api.post(f"{NODES}/gpu-x3/replace", {"with": "nope"})
    assert missing.status == 404


async def test_list_accepts_repeated_filters(api: Api) -> None:
    for rack, name in (("r1", "m1"), ("r2", "m2"), ("r3", "m3")):
        await api.enroll(hostname=name, serial=f"SN-{name}", rack=rack)
    await _active(api, "m4")
    both = await api.get(f"{NODES}?rack=r1&rack=r3")
    assert [item["hostname"] for item in both.body["items"]] == ["m1", "m3", "m4"]
    states = await api.get(f"{NODES}?state=enrolled&state=active")
    assert states.body["total"] == 4
    repeated = await api.get(f"{NODES}?limit=1&limit=2")
    assert repeated.status == 422 and "limit" in repeated.body["detail"]


async def test_bulk_action_previews_caps_and_applies(api: Api) -> None:
    for index in range(4):
        await api.enroll(hostname=f"b{index}", serial=f"SN-b{index}",
                         rack="r12" if index < 3 else "r13")
    body = {"filter": {"rack": ["r12"], "state": "enrolled"}, "action": "maintenance-on",
            "reason": "firmware", "max": 2}
    preview = await api.post(f"{NODES}/actions", body | {"dry_run": True})
    assert preview.status == 200
    assert (preview.body["total"], len(preview.body["matched"]), preview.body["applied"]) == \
        (3, 2, [])
    listed = await api.get(f"{NODES}?maintenance=true")
    assert listed.body["total"] == 0  # the dry run changed nothing
    capped = await api.post(f"{NODES}/actions", body)
    assert capped.status == 409 and "max 2" in capped.body["detail"]
    done = await api.post(f"{NODES}/actions", body | {"max": 3})
    assert done.status == 202, done.text
    assert sorted(n["hostname"] for n in done.body["applied"]) == ["b0", "b1", "b2"]
    maint = await api.get(f"{NODES}?maintenance=true")
    assert sorted(i["hostname"] for i in maint.body["items"]) == ["b0", "b1", "b2"]
    deploy = await api.post(f"{NODES}/actions", {"filter": {"rack": "r13"}, "action": "deploy"})
    assert deploy.status == 202 and deploy.body["applied"] == []
    assert [(n["hostname"], "enrolled" in n["error"]) for n in deploy.body["failed"]] == \
        [("b3", True)]
    empty = await api.post(f"{NODES}/actions", {"filter": {}, "action": "retire"})
    assert empty.status == 422
    unknown = await api.post(f"{NODES}/actions", {"filter": {"rack": "r13"}, "action": "x"})
    assert unknown.status == 422
