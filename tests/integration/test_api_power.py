"""``POST /nodes/{id}/power`` and ``/bootdev`` against the fake BMC driver: results, the
history rows with their actor, 409 while a step is in flight (``status`` excepted), roles,
and the power-state sync recording an out-of-band change."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from provisioner.bmc.base import PowerState
from provisioner.config import BmcSettings
from provisioner.domain import BmcEndpoint, NewNode, Role
from provisioner.lifecycle.power import PowerSync
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.integration.test_api import NODES, SECRET, Api, running_api


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    async with running_api(aiohttp_client, store, world) as started:
        yield started


async def enroll(api: Api, serial: str) -> dict[str, Any]:
    return await api.enroll(serial=serial, bmc={"driver": "fake", "address": serial,
                                                "username": "admin", "password": SECRET})


async def test_power_actions_are_confirmed_and_recorded_with_the_actor(
        api: Api, world: SimWorld) -> None:
    node = await enroll(api, "P1")
    reply = await api.post(f"{NODES}/{node['id']}/power", {"action": "on"})
    assert reply.status == 200, reply.text
    assert reply.body["power_state"] == "on" and reply.body["node"]["id"] == node["id"]
    assert await world.get("P1", "power") == "on"
    assert (await api.post(f"{NODES}/P1/power", {"action": "status"})).body["power_state"] \
        == "on"
    assert (await api.post(f"{NODES}/P1/power", {"action": "cycle"})).body["power_state"] \
        == "on"
    assert (await api.post(f"{NODES}/P1/power", {"action": "off"})).body["power_state"] \
        == "off"
    history = (await api.get(f"{NODES}/{node['id']}/history")).body["items"]
    rows = [(h["event"], h["actor"], h["from_state"], h["to_state"]) for h in history[1:]]
    assert rows == [("power_on", "token:operator-tok", "enrolled", "enrolled"),
                    ("power_cycle", "token:operator-tok", "enrolled", "enrolled"),
                    ("power_off", "token:operator-tok", "enrolled", "enrolled")]


async def test_bootdev_is_set_and_recorded(api: Api, world: SimWorld) -> None:
    node = await enroll(api, "B1")
    reply = await api.post(f"{NODES}/{node['id']}/bootdev",
                           {"device": "pxe", "persistent": True, "uefi": True})
    assert reply.status == 200, reply.text
    assert reply.body["device"] == "pxe" and reply.body["persistent"] is True
    assert await world.get("B1", "bootdev") == "pxe"
    last = (await api.get(f"{NODES}/{node['id']}/history")).body["items"][-1]
    assert (last["event"], last["reason"]) == ("bootdev", "boot device pxe (persistent, UEFI)")


async def test_refused_while_a_step_is_in_flight_except_status(api: Api) -> None:
    node = await api.store.nodes.create(NewNode(
        state=NodeState.INSPECTING, serial="F1", bmc=BmcEndpoint("fake", "F1")), actor="test")
    for path, body in ((f"{NODES}/{node.id}/power", {"action": "off"}),
                       (f"{NODES}/{node.id}/bootdev", {"device": "disk"})):
        reply = await api.post(path, body)
        assert reply.status == 409 and "its step owns the BMC" in reply.body["detail"]
    assert (await api.post(f"{NODES}/{node.id}/power", {"action": "status"})).status == 200


@pytest.mark.parametrize(("body", "status"), [
    ({"action": "explode"}, 422), ({}, 422), ({"action": "on", "extra": 1}, 422)],
    ids=["unknown-action", "missing", "extra-field"])
async def test_invalid_power_bodies(api: Api, body: dict[str, Any], status: int) -> None:
    node = await enroll(api, "V1")
    assert (await api.post(f"{NODES}/{node['id']}/power", body)).status == status


async def test_roles_and_missing_bmc(api: Api) -> None:
    node = await enroll(api, "R1")
    reply = await api.post(f"{NODES}/{node['id']}/power", {"action": "status"},
                           role=Role.VIEWER)
    assert reply.status == 403
    bare = await api.enroll(serial="NOBMC")
    reply = await api.post(f"{NODES}/{bare['id']}/power", {"action": "on"})
    assert reply.status == 422 and "no BMC endpoint" in reply.body["detail"]
    assert (await api.post(f"{NODES}/nope/power", {"action": "on"})).status == 404


async def test_power_sync_records_out_of_band_changes_only_for_idle_nodes(
        api: Api, world: SimWorld) -> None:
    idle = await enroll(api, "S1")
    busy = await api.store.nodes.create(NewNode(
        state=NodeState.INSPECTING, serial="S2", bmc=BmcEndpoint("fake", "S2")), actor="test")
    await api.post(f"{NODES}/{idle['id']}/power", {"action": "on"})
    await world.ensure("S1", "power_off", "power", "off")  # someone pulled the plug
    await world.ensure("S2", "power_on", "power", "on")
    conductor = api.conductor
    sync = PowerSync(api.store.nodes, conductor._ports.bmc, conductor.record_power,
                     BmcSettings())
    report = await sync.sweep()
    assert (report.read, report.changed, report.skipped) == (1, 1, 1)
    last = (await api.get(f"{NODES}/{idle['id']}/history")).body["items"][-1]
    assert (last["event"], last["actor"], last["from_state"], last["to_state"]) == (
        "power_sync", "power-sync", "enrolled", "enrolled")
    assert last["reason"] == "power on\u2192off out of band"
    assert (await api.store.nodes.get(busy.id)).power_state is None  # its step owns it
    assert (await sync.sweep()).changed == 0  # recorded once


async def test_a_sync_reading_overtaken_by_an_operators_power_on_is_not_recorded(
        api: Api, world: SimWorld) -> None:
    """A node with no power state recorded yet: the sync reads "off"; before it records,
    an operator powers the node on (recorded "on"): the older reading is dropped, not
    recorded as "on→off out of band" (a CI run saw that history)."""
    node = await enroll(api, "S3")
    conductor = api.conductor
    real = conductor._ports.bmc
    read, go_on = asyncio.Event(), asyncio.Event()

    class HeldRead:
        def __init__(self, bmc: Any) -> None:
            self._bmc = bmc

        async def power_state(self) -> PowerState:
            state = await self._bmc.power_state()
            read.set()
            await go_on.wait()
            return state  # type: ignore[no-any-return]

        async def aclose(self) -> None:
            await self._bmc.aclose()

    sync = PowerSync(api.store.nodes, lambda *args: HeldRead(real(*args)),  # type: ignore[arg-type,return-value]
                     conductor.record_power, BmcSettings())
    sweep = asyncio.create_task(sync.sweep())
    await read.wait()  # the sync has read "off"
    assert (await api.post(f"{NODES}/{node['id']}/power", {"action": "on"})).status == 200
    go_on.set()
    assert (await sweep).changed == 0
    assert (await api.store.nodes.get(node["id"])).power_state == "on"
    last = (await api.get(f"{NODES}/{node['id']}/history")).body["items"][-1]
    assert last["event"] == "power_on"
