"""The ``storage_layout`` servicing step through the conductor (issue 25): the ``redfish``
driver against the servicing BMC (tests/sim/redfish_update.py) serving DMTF's
``public-localstorage`` mockup (one RAID controller, four SAS drives; a RAID1 volume over two
of them and two RAID0 volumes over a third) with a ``Volumes`` collection that takes a POST.
A layout already there is left alone; a volume that needs drives other volumes hold fails
the step naming them unless ``storage_replace``; with it, the volumes outside the layout are
deleted and the new one is created over the freed drives, once: a second run changes
nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.redfish_service import SiteServicing
from provisioner.config.servicing import ServicingSettings
from provisioner.domain import BmcCredentials, BmcEndpoint, Node
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.service_record import ServiceRecord
from provisioner.lifecycle.states import Event, NodeState
from provisioner.lifecycle.steps import STEPS
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state
from tests.integration.test_boot_http import MAC, get_script
from tests.integration.test_boot_http import boot as boot  # noqa: F401  (fixture)
from tests.integration.test_servicing import MANUAL, _parked, conductor, new_node
from tests.integration.test_servicing import driver as driver  # noqa: F401  (fixture)
from tests.sim.redfish_storage import VOLUMES, StorageSim, attach_storage
from tests.sim.redfish_update import UpdateSim, make_app

S = NodeState
DRIVES = "/redfish/v1/Chassis/1U/Drives/"
BOOT = {"name": "boot", "raid": "RAID1", "drives": 2, "media": "HDD"}
SCRATCH = {"name": "scratch", "raid": "RAID0", "drives": 2}


def settings(storage: list[dict[str, Any]], *, replace: bool = False) -> ServicingSettings:
    return ServicingSettings.model_validate({
        "runbooks": {"onboard": {"steps": ["storage_layout"]}},
        "profiles": {"gpu": {"onboarding_runbook": "onboard", "storage": storage,
                             "storage_replace": replace}},
        "task_poll_s": 0.01})


@pytest.fixture
async def storage_bmc(aiohttp_server: Any) -> AsyncIterator[tuple[StorageSim, str]]:
    app = make_app(UpdateSim())
    storage = attach_storage(app, StorageSim())
    server = await aiohttp_server(app)
    yield storage, f"http://127.0.0.1:{server.port}"


async def _run(store: Store, world: Any, make_node: Any, driver: RedfishDriver, url: str,
               servicing: ServicingSettings, until: NodeState) -> Any:
    node = await new_node(make_node, url)
    cond = conductor(store, world, driver, servicing)
    await cond.fire(node.id, Event.DEPLOY, actor="op")
    done = await wait_for_state(store, node.id, until)
    await cond.stop()
    steps = [h.reason for h in await store.nodes.history(node.id)
             if h.event == "service_step"]
    return done, steps


async def test_a_layout_already_there_is_left_alone(  # type: ignore[no-untyped-def]
        store, world, make_node, storage_bmc, driver) -> None:
    sim, url = storage_bmc
    _, steps = await _run(store, world, make_node, driver, url, settings([BOOT]), S.DEPLOYING)
    assert sim.posts == [] and sim.deletes == []
    assert steps[-1] == ("storage_layout: redfish volumes: boot: RAID1 over 2 drives (already "
                         "there, left alone); left alone: Virtual Disk 2 (RAID0) not in the "
                         "layout; left alone: Virtual Disk 3 (RAID0) not in the layout")


async def test_drives_held_by_other_volumes_fail_the_step_naming_them(  # type: ignore[no-untyped-def]
        store, world, make_node, storage_bmc, driver) -> None:
    sim, url = storage_bmc
    failed, _ = await _run(store, world, make_node, driver, url, settings([BOOT, SCRATCH]),
                           S.SERVICE_FAILED)
    error = failed.last_error or ""
    assert "volume scratch (RAID0 over 2 drives) needs 2 free drives, 1 fit and are free" \
        in error
    assert "Virtual Disk 2 (RAID0), Virtual Disk 3 (RAID0) (storage_replace = true " \
        "deletes them)" in error
    assert sim.posts == [] and sim.deletes == []


async def test_replace_deletes_the_others_and_creates_once(  # type: ignore[no-untyped-def]
        store, world, make_node, storage_bmc, driver) -> None:
    sim, url = storage_bmc
    layout = settings([BOOT, SCRATCH], replace=True)
    _, steps = await _run(store, world, make_node, driver, url, layout, S.DEPLOYING)
    assert sim.deletes == [f"{VOLUMES}/2", f"{VOLUMES}/3"]
    assert sim.posts == [{"Name": "scratch", "RAIDType": "RAID0", "Links": {"Drives": [
        {"@odata.id": DRIVES + "32ADF365C6C1B7BD"}, {"@odata.id": DRIVES + "3D58ECBC375FD9F2"}]}}]
    assert "storage_layout: created volume scratch: RAID0 over 32ADF365C6C1B7BD, " \
        "3D58ECBC375FD9F2 (apply time Immediate)" in steps
    assert steps[-1] == ("storage_layout: redfish volumes: boot: RAID1 over 2 drives (already "
                         "there, left alone); scratch: RAID0 over 2 drives (created); deleted "
                         "Virtual Disk 2 (RAID0); deleted Virtual Disk 3 (RAID0)")
    # the same runbook on the next node of this BMC: everything is there, nothing asked
    _, again = await _run(store, world, make_node, driver, url, layout, S.DEPLOYING)
    assert len(sim.posts) == 1 and len(sim.deletes) == 2
    assert again[-1] == ("storage_layout: redfish volumes: boot: RAID1 over 2 drives (already "
                         "there, left alone); scratch: RAID0 over 2 drives (already there, left "
                         "alone)")


async def test_mdadm_arrays_through_the_agent_then_left_alone(  # type: ignore[no-untyped-def]
        store, world, make_node, driver) -> None:
    """The simulated agent (``FakeInstaller.build_arrays``): the arrays planned from the
    inspected disks, the ramdisk asked for and given back, each array in the history."""
    async def credentials(node: Node) -> BmcCredentials:
        return await store.nodes.credentials(node.id)

    layout = settings([{"name": "data", "raid": "RAID1", "drives": "all NVMe",
                        "via": "mdadm"}])
    ports = dataclasses.replace(fake_ports(world), servicing=SiteServicing(
        layout, driver, credentials))
    disks = [{"name": f"nvme{i}n1", "size_bytes": 3_840_000_000_000, "rotational": False}
             for i in range(2)] + [{"name": "sda", "size_bytes": 480_000_000_000,
                                    "rotational": False}]
    for serial, attempt in (("MD1", "created"), ("MD2", "already there, left alone")):
        # the same simulated machine (its BMC address), enrolled twice
        node = await make_node(S.INSPECTED, profile="gpu", serial=serial, bmc_password="pw",
                               bmc=BmcEndpoint(driver="fake", address="MD1"))
        await store.nodes.merge_facts(node.id, {"disks": disks})
        cond = Conductor(store.nodes, ports, MANUAL, steps={**STEPS, S.DEPLOYING: _parked})
        await cond.fire(node.id, Event.DEPLOY, actor="op")
        done = await wait_for_state(store, node.id, S.DEPLOYING)
        await cond.stop()
        history = [h.reason for h in await store.nodes.history(node.id)
                   if h.event == "service_step"]
        assert history[-1] == ("storage_layout: md arrays: data: /dev/md/data raid1 over "
                               f"nvme0n1, nvme1n1, state clean ({attempt})")
        record = ServiceRecord.from_facts(done.facts)
        assert record is not None and not record.netboot  # given back to its own disk
        ledger = {op: calls for (key, op), (calls, _) in world.ledger_blocking().items()
                  if key == "MD1"}
        runs = 1 if serial == "MD1" else 2
        # each run: netbooted (PXE, off, on), then power-cycled back to its disk; the
        # array made once
        assert (ledger["bootdev"], ledger["power_on"], ledger["power_cycle"]) == (runs,) * 3
        assert ledger["md:data"] == 1


async def test_on_reset_bmc_stages_the_changes_for_a_power_cycle(  # type: ignore[no-untyped-def]
        store, world, make_node, storage_bmc, driver) -> None:
    """A BMC that lists only ``OnReset``: each change is asked for with that apply time and
    answers a task that stays Pending; a power cycle applies the deletions (their drives
    freed), another the creation, and the tasks are followed to Completed after each."""
    sim, url = storage_bmc
    sim.apply_times = ["OnReset"]
    _, steps = await _run(store, world, make_node, driver, url,
                          settings([BOOT, SCRATCH], replace=True), S.DEPLOYING)
    assert sim.posts == [{"Name": "scratch", "RAIDType": "RAID0",
                          "@Redfish.OperationApplyTime": "OnReset", "Links": {"Drives": [
                              {"@odata.id": DRIVES + "32ADF365C6C1B7BD"},
                              {"@odata.id": DRIVES + "3D58ECBC375FD9F2"}]}}]
    assert sim.resets == 2 and sim.tasks == {"vol1": "Completed", "vol2": "Completed",
                                             "vol3": "Completed"}
    assert steps[-1].startswith("storage_layout: redfish volumes: boot: RAID1 over 2 drives "
                                "(already there, left alone); scratch: RAID0 over 2 drives "
                                "(created)")


async def test_a_servicing_node_boots_the_ramdisk_only_while_the_record_asks(  # type: ignore[no-untyped-def]
        boot, make_node) -> None:
    """The boot server: a node in ``servicing`` is handed the agent's ramdisk only while
    its servicing record says ``netboot`` (storage_layout's mdadm arrays), else its disk."""
    record = ServiceRecord.open("onboard", ("storage_layout",), "onboarding", "op")
    node = await make_node(S.SERVICING, macs=(MAC,), profile="gpu")
    await boot.store.nodes.merge_facts(node.id, {"servicing": record.to_facts()})
    local = await get_script(boot, MAC)
    assert "sanboot" in local and "token" not in local
    await boot.store.nodes.merge_facts(node.id, {
        "servicing": record.with_netboot(True).to_facts()})
    script = await get_script(boot, MAC)
    assert "provisioner.token=pvt_" in script and "/artefacts/inspect/vmlinuz" in script
    await boot.store.nodes.merge_facts(node.id, {"servicing": record.to_facts()})
    local = await get_script(boot, MAC)
    assert "sanboot" in local and "token" not in local


async def test_killed_between_the_bmc_taking_a_change_and_its_answer_asks_once(  # type: ignore[no-untyped-def]
        store, world, make_node, storage_bmc, driver) -> None:
    """The kill window twice, on a BMC that stages changes for the next reset: the daemon
    stops after the BMC took the deletion of Virtual Disk 2 (its task made, the answer not
    yet back), then, resumed, after it took the creation of ``scratch``. Each time the
    resumed step finds the change's task (one it did not know, whose payload is that DELETE
    or POST) and follows it: each volume deleted once, ``scratch`` asked for once, one
    ``scratch`` after the resets. Without the intent written first, the resumed step asked
    again (the volumes still show until the reset)."""
    sim, url = storage_bmc
    sim.apply_times = ["OnReset"]
    layout = settings([BOOT, SCRATCH], replace=True)
    node = await new_node(make_node, url)
    for method, key in (("DELETE", f"volume:delete:{VOLUMES}/2"),
                        ("POST", "volume:create:scratch"), ("", "")):
        held = asyncio.Event()
        sim.hold = (method, held) if method else None
        cond = conductor(store, world, driver, layout)
        if method == "DELETE":
            await cond.fire(node.id, Event.DEPLOY, actor="op")
        else:
            assert await cond.recover() == 1
        if not method:
            done = await wait_for_state(store, node.id, S.DEPLOYING)
            await cond.stop()
            break
        async with asyncio.timeout(10):
            while not any(p["HttpOperation"] == method  # noqa: ASYNC110  (the BMC's state)
                          for p in sim.payloads.values()):
                await asyncio.sleep(0.02)
        await cond.stop()  # gone before the BMC's answer
        held.set()
        record = ServiceRecord.from_facts((await store.nodes.get(node.id)).facts)
        assert record is not None and record.asking(key), record
    assert sim.deletes == [f"{VOLUMES}/2", f"{VOLUMES}/3"] and len(sim.posts) == 1
    assert sorted(v["Name"] for v in sim.volumes()) == ["Virtual Disk 1", "scratch"]
    assert sim.resets == 2
    history = [h.reason for h in await store.nodes.history(node.id)]
    followed = [r for r in history if "followed, not asked for again" in r]
    assert [r.split(" asked for")[0] for r in followed] == [
        "storage_layout: the deletion of Virtual Disk 2",
        "storage_layout: the creation of volume scratch"], followed
    assert ServiceRecord.from_facts(done.facts).outcome == "passed"  # type: ignore[union-attr]
