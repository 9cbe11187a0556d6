"""Safe imports and brownfield adoption through the REST API (issue 30, items 2, 3 and 9):
dry runs, live nodes never renamed without a flag, history rows with the actor, rotated BMC
passwords kept, MACs of known serials, ``state=active``, the profile registry, and the
confirmation that re-imaging an active node needs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from provisioner.config import Settings
from provisioner.config.profiles import ProfileRegistry, profile_registry
from provisioner.domain import Role
from provisioner.lifecycle.rotation import ROTATED
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.integration.test_api import NODES, SECRET, Api, running_api

IMPORT = "/api/v1/inventory/import"
CSV = {"Content-Type": "text/csv"}
RACK = """\
serial,hostname,rack,position,profile,macs,state
BF-1,run-01,r7,u1,gpu-worker,52:54:00:30:00:01,active
BF-2,new-02,r7,u2,gpu-worker,52:54:00:30:00:02,
"""


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    registry = profile_registry(Settings.model_validate(
        {"validation": {"profiles": {"gpu-worker": {"gpu_count": 8}}},
         "kube": {"profiles": {"cpu-worker": {}}}}))
    async with running_api(aiohttp_client, store, world, profiles=registry) as started:
        yield started


async def _csv(api: Api, text: str, query: str = "", **kw: Any) -> Any:
    return await api.call("POST", IMPORT + query, data=text.encode(), headers=CSV, **kw)


async def _history(api: Api, node: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await api.get(f"{NODES}/{node}/history")).body["items"]
    return items


async def test_dry_run_changes_nothing_and_reports_each_node(api: Api) -> None:
    await api.enroll(serial="BF-2", hostname="old-02", macs=["52:54:00:30:00:09"])
    before = await _history(api, "BF-2")
    reply = await _csv(api, RACK, "?dry_run=true")
    assert reply.status == 200, reply.text
    assert reply.body["dry_run"] is True
    assert reply.body["created"] == [] and reply.body["updated"] == []
    by_serial = {change["serial"]: change for change in reply.body["changes"]}
    assert by_serial["BF-1"]["action"] == "create" and by_serial["BF-1"]["node"] is None
    assert "register running as active (no inspection, no disk write)" in \
        by_serial["BF-1"]["changes"]
    update = by_serial["BF-2"]
    assert update["action"] == "update"
    assert "hostname: old-02 -> new-02" in update["changes"]
    assert "macs: +52:54:00:30:00:02" in update["changes"]
    assert any("52:54:00:30:00:09" in note for note in update["notes"])  # kept, not pruned
    nodes = (await api.get(NODES)).body["items"]
    assert [(n["serial"], n["hostname"]) for n in nodes] == [("BF-2", "old-02")]
    assert await _history(api, "BF-2") == before


async def test_state_active_registers_a_running_machine_without_a_disk_write(
        api: Api, world: SimWorld) -> None:
    reply = await _csv(api, RACK)
    assert reply.status == 200, reply.text
    running = (await api.get(f"{NODES}/BF-1")).body
    assert running["state"] == "active" and running["macs"] == ["52:54:00:30:00:01"]
    history = running["history"]
    assert [(h["event"], h["to_state"], h["actor"]) for h in history] == [
        ("enroll", "active", "token:operator-tok")]
    assert "brownfield" in history[0]["reason"]
    assert (await api.get(f"{NODES}/BF-2")).body["state"] == "enrolled"
    # nothing was installed: no step ran for the running machine
    assert api.conductor.step_status(running["id"]) is None


async def test_register_running_action_and_reimage_needs_confirm(api: Api) -> None:
    node = await api.enroll(serial="BF-9", hostname="legacy-09", profile="gpu-worker")
    reply = await api.post(f"{NODES}/legacy-09/actions/register-running",
                           {"reason": "runs Ubuntu 22.04 since 2024"})
    assert reply.status == 202, reply.text
    assert reply.body["state"] == "active"
    refused = await api.post(f"{NODES}/legacy-09/actions/deploy", {"reason": "new image"})
    assert refused.status == 409
    assert "legacy-09 is active" in refused.body["detail"]
    assert "erasing its disks" in refused.body["detail"] and "confirm" in refused.body["detail"]
    assert (await api.get(f"{NODES}/{node['id']}")).body["state"] == "active"
    accepted = await api.post(f"{NODES}/legacy-09/actions/deploy",
                              {"reason": "new image", "confirm": True})
    assert accepted.status == 202, accepted.text
    assert accepted.body["state"] == "deploying"
    events = [h["event"] for h in await _history(api, "legacy-09")]
    assert events[:3] == ["enroll", "register_running", "deploy"]


async def test_a_live_node_is_not_renamed_or_reprofiled_without_the_flag(api: Api) -> None:
    await _csv(api, RACK)
    rename = "serial,hostname,profile\nBF-1,renamed-01,cpu-worker\n"
    reply = await _csv(api, rename)
    assert reply.status == 200
    assert reply.body["updated"] == [] and len(reply.body["errors"]) == 1
    assert "is active" in reply.body["errors"][0]
    assert "allow_live_changes" in reply.body["errors"][0]
    assert (await api.get(f"{NODES}/BF-1")).body["hostname"] == "run-01"
    # rack and position of a live node are not identity: they change without the flag
    moved = await _csv(api, "serial,rack\nBF-1,r8\n")
    assert moved.body["errors"] == [] and len(moved.body["updated"]) == 1

    forced = await _csv(api, rename, "?allow_live_changes=true")
    assert forced.body["errors"] == [] and len(forced.body["updated"]) == 1
    node = (await api.get(f"{NODES}/BF-1")).body
    assert (node["hostname"], node["profile"], node["state"]) == (
        "renamed-01", "cpu-worker", "active")
    rows = [h for h in node["history"] if h["event"] == "import"]
    assert [(h["actor"], h["from_state"], h["to_state"]) for h in rows] == [
        ("token:operator-tok", "active", "active")] * 2
    assert rows[0]["reason"] == "rack: r7 -> r8"
    assert rows[1]["reason"] == ("hostname: run-01 -> renamed-01; "
                                 "profile: gpu-worker -> cpu-worker")


async def test_macs_of_known_serials_added_and_removed_only_with_prune(api: Api) -> None:
    await api.enroll(serial="M-1", macs=["52:54:00:31:00:01", "52:54:00:31:00:02"])
    text = "serial,macs\nM-1,52:54:00:31:00:02 52:54:00:31:00:03\n"
    added = await _csv(api, text)
    assert added.body["errors"] == [] and len(added.body["updated"]) == 1
    node = (await api.get(f"{NODES}/M-1")).body
    assert node["macs"] == ["52:54:00:31:00:01", "52:54:00:31:00:02", "52:54:00:31:00:03"]
    assert (await api.get(f"{NODES}/52:54:00:31:00:03")).body["serial"] == "M-1"
    pruned = await _csv(api, text, "?prune_macs=true")
    assert pruned.body["changes"][0]["changes"] == ["macs: -52:54:00:31:00:01"]
    node = (await api.get(f"{NODES}/M-1")).body
    assert node["macs"] == ["52:54:00:31:00:02", "52:54:00:31:00:03"]
    assert (await api.get(f"{NODES}/52:54:00:31:00:01")).status == 404
    reasons = [h["reason"] for h in node["history"] if h["event"] == "import"]
    assert reasons == ["macs: +52:54:00:31:00:03", "macs: -52:54:00:31:00:01"]


async def test_a_reimport_never_puts_back_a_rotated_bmc_password(api: Api,
                                                                  store: Store) -> None:
    row = ("serial,bmc_driver,bmc_address,bmc_username,bmc_password\n"
           f"R-1,fake,bmc-r1,admin,{SECRET}\n")
    created = await _csv(api, row, role=Role.ADMIN)
    node_id = created.body["created"][0]
    # what BmcRotation.rotate writes once the BMC took the new password and a fresh login
    # with it worked (the BMC side is tests/integration/test_bmc_rotation.py's)
    await store.bmc_secrets.begin(node_id, "Rotated0Pass1word")
    await store.bmc_secrets.promote(node_id, username="admin", event=ROTATED,
                                    actor="token:admin-tok", reason="rotated")
    again = await _csv(api, row, role=Role.ADMIN)
    assert again.body["errors"] == [] and again.body["updated"] == []
    change = again.body["changes"][0]
    assert change["action"] == "unchanged"
    assert any("rotated" in note for note in change["notes"])
    assert (await store.nodes.credentials(node_id)).password == "Rotated0Pass1word"
    # an operator (not admin) re-importing the sheet is not refused for it either
    assert (await _csv(api, row)).body["errors"] == []


async def test_unknown_profiles_are_rejected_and_the_registry_is_listed(api: Api) -> None:
    reply = await _csv(api, "serial,profile\nP-1,gpu-worker\nP-2,gpu-wroker\n")
    assert reply.status == 422
    assert [(e["row"], e["loc"], e["type"]) for e in reply.body["errors"]] == [
        (2, "profile", "unknown_profile")]
    assert "gpu-wroker" in reply.body["errors"][0]["msg"]
    assert (await api.get(NODES)).body["total"] == 0
    enroll = await api.post(NODES, {"serial": "P-3", "profile": "nope"})
    assert enroll.status == 422 and "known profiles: cpu-worker, gpu-worker" in \
        enroll.body["detail"]
    listed = (await api.get("/api/v1/profiles")).body
    assert listed == {"enforced": True, "items": [
        {"name": "cpu-worker", "sections": ["kube.profiles"]},
        {"name": "gpu-worker", "sections": ["validation.profiles"]}]}


def test_an_empty_registry_accepts_any_name() -> None:
    registry = profile_registry(Settings())
    assert registry == ProfileRegistry()
    registry.check("anything")  # no profile configured: nothing to check against
