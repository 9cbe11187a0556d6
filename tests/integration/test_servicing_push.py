"""Firmware pushed to ``UpdateService.MultipartHttpPushUri`` (issue 25) through the conductor:
the ``redfish`` driver against the servicing BMC (tests/sim/redfish_update.py) shaped as
OpenBMC's bmcweb offers it (SimpleUpdate for HTTPS only, a MultipartHttpPushUri with
``Immediate``/``OnReset`` apply times), images from our artefact directory. ``auto`` pushes
where SimpleUpdate cannot take our HTTP URL; the parts are the ones bmcweb parses, the bytes
arrive intact, the image is streamed (not read whole into memory), the task is followed, a
daemon stopped after the BMC took a push follows that push's task instead of pushing again
(one stopped mid-upload pushes again, once), and a BMC offering neither method fails the
step saying so."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import tracemalloc
from pathlib import Path
from typing import Any

from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.redfish_service import RedfishService, SiteServicing
from provisioner.config.servicing import ServicingSettings
from provisioner.domain import BmcCredentials, BmcEndpoint, Node
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.service_record import ServiceRecord
from provisioner.lifecycle.states import Event, NodeState
from provisioner.lifecycle.steps import STEPS
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state
from tests.integration.test_servicing import MANUAL, _parked, new_node, settings
from tests.integration.test_servicing import bmc_sim as bmc_sim  # noqa: F401  (fixture)
from tests.integration.test_servicing import driver as driver  # noqa: F401  (fixture)
from tests.sim.redfish_update import PUSH, TASKS, UpdateSim

S = NodeState
INVENTORY = "/redfish/v1/UpdateService/FirmwareInventory/"
STEPS_FW = ["firmware_inventory", "firmware_update"]


def bmcweb(sim: UpdateSim) -> None:
    """bmcweb's UpdateService: SimpleUpdate for HTTPS only, a MultipartHttpPushUri."""
    sim.simple_protocols, sim.multipart = ["HTTPS"], True


def images(tmp: Path) -> dict[str, bytes]:
    made = {"bios-1.2.0.bin": bytes(range(256)) * 12289,  # ~3 MiB: many chunks
            "nic-22.41.1.bin": b"\x7fNIC" * 1000}
    for name, data in made.items():
        (tmp / name).write_bytes(data)
    return made


def conductor(store: Store, world: Any, driver: RedfishDriver, servicing: ServicingSettings,
              image_dir: Path) -> Conductor:
    async def credentials(node: Node) -> BmcCredentials:
        return await store.nodes.credentials(node.id)

    site = SiteServicing(servicing, driver, credentials, image_dir)
    ports = dataclasses.replace(fake_ports(world), bmc=driver, servicing=site)
    return Conductor(store.nodes, ports, MANUAL, steps={**STEPS, S.DEPLOYING: _parked})


async def test_auto_pushes_where_simple_update_cannot_take_our_url(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver, tmp_path) -> None:
    sim, url = bmc_sim
    bmcweb(sim)
    sent = images(tmp_path)
    node = await new_node(make_node, url)
    cond = conductor(store, world, driver, settings(STEPS_FW), tmp_path)
    await cond.fire(node.id, Event.DEPLOY, actor="op")
    done = await wait_for_state(store, node.id, S.DEPLOYING)
    await cond.stop()
    assert sim.updates == []  # no SimpleUpdate: it takes HTTPS only, our URL is http
    assert [p["filename"] for p in sim.pushes] == ["bios-1.2.0.bin", "nic-22.41.1.bin"]
    for pushed, cid in zip(sim.pushes, ("BIOS", "NIC.Slot.1"), strict=True):
        assert pushed["parts"] == [("UpdateParameters", "application/json"),
                                   ("UpdateFile", "application/octet-stream")]
        assert pushed["parameters"] == {"Targets": [INVENTORY + cid],
                                        "@Redfish.OperationApplyTime": "Immediate"}
        data = sent[pushed["filename"]]
        assert (pushed["size"], pushed["sha256"]) == (len(data),
                                                      hashlib.sha256(data).hexdigest())
    assert sim.pushes[0]["chunks"] > 1
    assert sim.versions == {"BIOS": "1.2.0", "BMC": "5.10", "NIC.Slot.1": "22.41.1"}
    record = ServiceRecord.from_facts(done.facts)
    assert record is not None and record.tasks == {"BIOS": f"{TASKS}/1",
                                                   "NIC.Slot.1": f"{TASKS}/2"}
    history = [h.reason for h in await store.nodes.history(node.id)]
    assert any(r.startswith("BIOS: 1.0.0 → 1.2.0 from bios-1.2.0.bin by "
                            "MultipartHttpPushUri; task ") for r in history), history
    assert "ForceRestart" in sim.resets  # BIOS and NIC activate on the power cycle


async def test_a_bmc_with_neither_method_fails_the_step_saying_so(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver, tmp_path) -> None:
    sim, url = bmc_sim
    sim.simple_protocols = None  # no SimpleUpdate, no push
    images(tmp_path)
    node = await new_node(make_node, url)
    cond = conductor(store, world, driver, settings(STEPS_FW), tmp_path)
    await cond.fire(node.id, Event.DEPLOY, actor="op")
    failed = await wait_for_state(store, node.id, S.SERVICE_FAILED)
    await cond.stop()
    assert ("firmware_transfer auto: no way to send http://127.0.0.1:1/firmware/"
            "bios-1.2.0.bin: the UpdateService has no SimpleUpdate; the UpdateService has "
            "no MultipartHttpPushUri") in (failed.last_error or "")
    assert sim.updates == [] and sim.pushes == [] and sim.tasks == {}


async def test_stopped_after_the_bmc_took_a_push_follows_its_task(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver, tmp_path) -> None:
    """The BMC took the push and made its task, the daemon stopped before the answer: a
    push's task payload does not name the image (bmcweb keeps the URI and method only), so
    the intent kept the BMC's tasks from before it; the resumed step finds the new task
    that is a POST to the push URI and follows it: the BIOS is pushed once. A task of the
    BMC's own from before (running) is not taken for it."""
    sim, url = bmc_sim
    bmcweb(sim)
    images(tmp_path)
    sim.tasks["1"] = {"target": "BMC", "version": "5.10", "polls": -10**6, "transfer": "",
                      "payload": {"HttpOperation": "POST", "TargetUri": PUSH, "JsonBody": ""}}
    sim.answer_hold = asyncio.Event()
    node = await new_node(make_node, url)
    first = conductor(store, world, driver, settings(STEPS_FW), tmp_path)
    await first.fire(node.id, Event.DEPLOY, actor="op")
    async with asyncio.timeout(10):
        while len(sim.tasks) < 2:  # noqa: ASYNC110  (the BMC's own state)
            await asyncio.sleep(0.02)
    await first.stop()  # gone before the BMC's answer
    record = ServiceRecord.from_facts((await store.nodes.get(node.id)).facts)
    assert record is not None and record.asking("BIOS")
    assert record.known("BIOS") == (f"{TASKS}/1",)
    sim.answer_hold = None
    await _resume_pushing_each_image_once(store, world, driver, tmp_path, node.id, sim)
    history = [h.reason for h in await store.nodes.history(node.id)]
    assert any("is the BMC's task /redfish/v1/TaskService/Tasks/2: followed" in r
               for r in history), history


async def test_a_push_streams_the_file(bmc_sim, driver, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A 48 MiB image pushed with under 8 MiB of Python memory at the peak (the sim reads it
    in 64 KiB chunks and keeps only its hash): the file is streamed, not read whole."""
    sim, url = bmc_sim
    bmcweb(sim)
    image = tmp_path / "gpu-96.00.61.bin"
    with image.open("wb") as out:
        out.truncate(48 << 20)
        out.seek(20 << 20)
        out.write(b"middle")
    service = RedfishService(driver("n1", BmcEndpoint(driver="redfish", address=url,
                                                      username="admin"),
                                    BmcCredentials("admin", "password")).client)
    tracemalloc.start()
    try:
        task = await service.push_update(str(image), [INVENTORY + "BIOS"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert task == f"{TASKS}/1"
    digest = hashlib.sha256()
    with image.open("rb") as got:
        while chunk := got.read(1 << 20):
            digest.update(chunk)
    assert (sim.pushes[0]["size"], sim.pushes[0]["sha256"]) == (48 << 20, digest.hexdigest())
    assert peak < 8 << 20, peak


async def test_stopped_mid_upload_pushes_again_once(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver, tmp_path) -> None:
    """The daemon stops while the image is on its way: the BMC drops the broken upload and
    makes no task. The resumed step finds no task newer than its intent; a push task of
    the BMC's from before (still running) is not taken for it: the BIOS is pushed again,
    once, and its task followed."""
    sim, url = bmc_sim
    bmcweb(sim)
    images(tmp_path)
    with (tmp_path / "bios-1.2.0.bin").open("r+b") as big:  # more than the sockets buffer
        big.truncate(40 << 20)
    sim.tasks["1"] = {"target": "BMC", "version": "5.10", "polls": -10**6, "transfer": "",
                      "payload": {"HttpOperation": "POST", "TargetUri": PUSH, "JsonBody": ""}}
    sim.push_hold = asyncio.Event()
    node = await new_node(make_node, url)
    first = conductor(store, world, driver, settings(STEPS_FW), tmp_path)
    await first.fire(node.id, Event.DEPLOY, actor="op")
    async with asyncio.timeout(10):
        while not sim.arrived:  # noqa: ASYNC110  (the BMC's own state)
            await asyncio.sleep(0.02)
    await first.stop()  # gone mid-upload
    sim.push_hold.set()
    async with asyncio.timeout(10):
        while not sim.broken:  # noqa: ASYNC110  (the BMC's own state)
            await asyncio.sleep(0.02)
    assert sim.pushes == [] and list(sim.tasks) == ["1"]
    sim.push_hold = None
    await _resume_pushing_each_image_once(store, world, driver, tmp_path, node.id, sim)
    assert sim.versions["BIOS"] == "1.2.0"


async def _resume_pushing_each_image_once(  # type: ignore[no-untyped-def]
        store, world, driver, tmp_path, node_id: str, sim) -> None:
    """A second daemon resumes the runbook: each image pushed once in all, the BIOS's
    update followed through the BMC's second task."""
    second = conductor(store, world, driver, settings(STEPS_FW), tmp_path)
    assert await second.recover() == 1
    done = await wait_for_state(store, node_id, S.DEPLOYING)
    await second.stop()
    assert [p["filename"] for p in sim.pushes] == ["bios-1.2.0.bin", "nic-22.41.1.bin"]
    record = ServiceRecord.from_facts(done.facts)
    assert record is not None and record.tasks["BIOS"] == f"{TASKS}/2"
