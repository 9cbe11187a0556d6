"""Runbooks through the conductor (issue 25): a real SQLite store, the ``redfish`` driver
against a small Redfish BMC (tests/sim/redfish_update.py: BIOS with sushy-tools' attribute
registry, FirmwareInventory, SimpleUpdate and its task monitor), the onboarding runbook
between ``inspected`` and ``deploying``, the registry refusing a baseline before anything
is applied, the BMC's own message in ``service_failed``, an IPMI BMC refused, and a daemon
stopped while a firmware task runs resuming it without a second update."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.redfish_service import SiteServicing
from provisioner.config import BootSettings, LifecycleSettings, Settings
from provisioner.config.servicing import ServicingSettings
from provisioner.daemon.preflight import Preflight, check_firmware_images
from provisioner.domain import BmcCredentials, BmcEndpoint, Node
from provisioner.errors import ConfigError
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.service_record import ServiceRecord
from provisioner.lifecycle.states import Event, NodeState
from provisioner.lifecycle.steps import STEPS, StepContext
from provisioner.simulation.drivers import simulated_facts
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state
from tests.integration.test_boot_http import boot as boot  # noqa: F401  (fixture)
from tests.sim.redfish_update import UpdateSim, make_app

S = NodeState
MANUAL = LifecycleSettings(auto_inspect=False, auto_deploy=False)
ALL_STEPS = ["firmware_inventory", "bios_settings", "firmware_update"]


async def _parked(ctx: StepContext) -> None:
    """The deploy step, parked: these tests end where onboarding hands the node on."""
    await asyncio.Event().wait()


def settings(steps: list[str], *, bios: dict[str, Any] | None = None,
             **limits: float) -> ServicingSettings:
    return ServicingSettings.model_validate({
        "runbooks": {"onboard": {"steps": steps}, "fw": {"steps": ["firmware_update"]}},
        "profiles": {"gpu": {
            "onboarding_runbook": "onboard",
            "bios": bios if bios is not None else {"ProcTurboMode": "Enabled",
                                                   "QuietBoot": True},
            "firmware": [{"id": "BIOS", "version": "1.2.0", "image": "bios-1.2.0.bin"},
                         {"id": "NIC.*", "version": "22.41.1", "image": "nic-22.41.1.bin"}]}},
        "image_base_url": "http://127.0.0.1:1/firmware",
        "task_poll_s": 0.01, "task_stall_s": limits.get("stall", 30.0), "bmc_good_reads": 2})


@pytest.fixture
async def bmc_sim(aiohttp_server: Any) -> AsyncIterator[tuple[UpdateSim, str]]:
    sim = UpdateSim()
    server = await aiohttp_server(make_app(sim))
    yield sim, f"http://127.0.0.1:{server.port}"


@pytest.fixture
async def driver() -> AsyncIterator[RedfishDriver]:
    redfish = RedfishDriver(timeout_s=5)
    yield redfish
    await redfish.aclose()


def conductor(store: Store, world: SimWorld, driver: RedfishDriver,
              servicing: ServicingSettings) -> Conductor:
    async def credentials(node: Node) -> BmcCredentials:
        return await store.nodes.credentials(node.id)

    ports = dataclasses.replace(fake_ports(world), bmc=driver,
                                servicing=SiteServicing(servicing, driver, credentials))
    return Conductor(store.nodes, ports, MANUAL, steps={**STEPS, S.DEPLOYING: _parked})


async def new_node(make_node: Any, url: str, driver_name: str = "redfish") -> Node:
    node: Node = await make_node(S.INSPECTED, profile="gpu", bmc_password="password",
                                 bmc=BmcEndpoint(driver=driver_name, address=url,
                                                 username="admin"))
    return node


async def until_started(store: Store, node_id: str, component: str) -> None:
    async with asyncio.timeout(10):
        while True:
            if any(item.endswith(f":{component}:started")
                   for item in (await store.nodes.get(node_id)).checkpoint):
                return
            await asyncio.sleep(0.02)


async def test_onboarding_runbook_between_inspected_and_deploying(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver) -> None:
    sim, url = bmc_sim
    node = await new_node(make_node, url)
    cond = conductor(store, world, driver, settings(ALL_STEPS))
    started = await cond.fire(node.id, Event.DEPLOY, actor="op")
    assert started.state == S.SERVICING
    done = await wait_for_state(store, node.id, S.DEPLOYING)
    # BIOS: validated, written once as pending with the apply time the BMC offers, in
    # effect after the reset
    assert sim.patches == [{"Attributes": {"ProcTurboMode": "Enabled", "QuietBoot": True},
                            "@Redfish.SettingsApplyTime": {"ApplyTime": "OnReset"}}]
    assert sim.bios["ProcTurboMode"] == "Enabled" and sim.bios["QuietBoot"] is True
    # firmware: the two drifted components, each once, from our image URL over HTTP
    assert sorted((u["Targets"][0].rsplit("/", 1)[-1], u["ImageURI"], u["TransferProtocol"])
                  for u in sim.updates) == [
        ("BIOS", "http://127.0.0.1:1/firmware/bios-1.2.0.bin", "HTTP"),
        ("NIC.Slot.1", "http://127.0.0.1:1/firmware/nic-22.41.1.bin", "HTTP")]
    assert sim.versions == {"BIOS": "1.2.0", "BMC": "5.10", "NIC.Slot.1": "22.41.1"}
    assert "ForceRestart" in sim.resets
    record = ServiceRecord.from_facts(done.facts)
    assert record is not None and record.outcome == "passed" and record.runbook == "onboard"
    assert [s for s, _, _ in record.results if ":" not in s] == ALL_STEPS
    history = await store.nodes.history(node.id)
    steps = [h.reason for h in history if h.event == "service_step"]
    assert any(r.startswith("firmware_inventory: 3 components; drifted: BIOS 1.0.0") for r in steps)
    assert any(r.startswith("firmware_update: updated BIOS, NIC.Slot.1") for r in steps)
    assert [h.event for h in history if h.to_state == S.DEPLOYING] == ["onboarded"]
    # once onboarded, a second deploy goes straight on
    assert ServiceRecord.from_facts(done.facts).onboarded("onboard")  # type: ignore[union-attr]
    await cond.stop()


async def test_registry_refuses_the_baseline_before_anything_is_applied(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver) -> None:
    sim, url = bmc_sim
    node = await new_node(make_node, url)
    bad = {"ProcTurboMode": "Turbo", "HyperThreading": "Enabled", "NumCores": 12,
           "QuietBoot": True}
    cond = conductor(store, world, driver, settings(["bios_settings"], bios=bad))
    await cond.fire(node.id, Event.DEPLOY, actor="op")
    failed = await wait_for_state(store, node.id, S.SERVICE_FAILED)
    error = failed.last_error or ""
    assert "nothing applied" in error
    assert "ProcTurboMode: 'Turbo' not allowed (allowed: Enabled, Disabled)" in error
    assert "HyperThreading: unknown attribute" in error
    assert "NumCores: read-only in the registry" in error
    assert sim.patches == [] and sim.resets == []
    await cond.stop()


async def test_failed_update_task_carries_the_bmc_message(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver) -> None:
    sim, url = bmc_sim
    sim.task_fault = "exception"
    node = await new_node(make_node, url)
    cond = conductor(store, world, driver, settings(["firmware_update"]))
    await cond.fire(node.id, Event.DEPLOY, actor="op")
    failed = await wait_for_state(store, node.id, S.SERVICE_FAILED)
    assert "Verification of image 'bios.bin' at 'BIOS' failed." in (failed.last_error or "")
    assert len(sim.updates) == 1  # stopped at the first failed component
    await cond.stop()


async def test_vanished_task_is_judged_by_the_version_and_a_stalled_one_fails(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver) -> None:
    sim, url = bmc_sim
    sim.task_fault = "vanish"
    node = await new_node(make_node, url)
    cond = conductor(store, world, driver, settings(["firmware_update"]))
    await cond.fire(node.id, Event.DEPLOY, actor="op")
    await wait_for_state(store, node.id, S.DEPLOYING)
    assert sim.versions["BIOS"] == "1.2.0" and len(sim.updates) == 2
    await cond.stop()
    sim.task_fault, sim.versions["NIC.Slot.1"] = "stall", "22.31.6"
    other = await new_node(make_node, url)
    cond = conductor(store, world, driver, settings(["firmware_update"], stall=0.3))
    await cond.fire(other.id, Event.DEPLOY, actor="op")
    failed = await wait_for_state(store, other.id, S.SERVICE_FAILED)
    assert "made no progress for 0.3 s (at 10%)" in (failed.last_error or "")
    await cond.stop()


async def test_ipmi_bmc_fails_clearly_never_skips(  # type: ignore[no-untyped-def]
        store, world, make_node, driver) -> None:
    node = await new_node(make_node, "127.0.0.1", driver_name="ipmi")
    cond = conductor(store, world, driver, settings(["firmware_inventory"]))
    await cond.fire(node.id, Event.DEPLOY, actor="op")
    failed = await wait_for_state(store, node.id, S.SERVICE_FAILED)
    assert "this BMC has no Redfish UpdateService (driver ipmi)" in (failed.last_error or "")
    await cond.stop()


async def test_stopped_during_a_firmware_task_resumes_it_without_a_second_update(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver) -> None:
    sim, url = bmc_sim
    sim.hold = asyncio.Event()
    node = await new_node(make_node, url)
    first = conductor(store, world, driver, settings(["firmware_inventory", "firmware_update"]))
    await first.fire(node.id, Event.DEPLOY, actor="op")
    await until_started(store, node.id, "BIOS")
    await first.stop()  # the daemon goes away while the BMC's task runs
    killed = await store.nodes.get(node.id)
    assert killed.state == S.SERVICING and len(sim.updates) == 1
    assert "service:0:firmware_inventory" in killed.checkpoint
    second = conductor(store, world, driver, settings(["firmware_inventory",
                                                       "firmware_update"]))
    assert await second.recover() == 1
    sim.hold.set()
    done = await wait_for_state(store, node.id, S.DEPLOYING)
    targets = [u["Targets"][0].rsplit("/", 1)[-1] for u in sim.updates]
    assert targets == ["BIOS", "NIC.Slot.1"]  # BIOS once: its task polled, not restarted
    record = ServiceRecord.from_facts(done.facts)
    assert record is not None and set(record.tasks) == {"BIOS", "NIC.Slot.1"}
    history = await store.nodes.history(node.id)
    assert sum(1 for h in history if h.reason.startswith("firmware_inventory:")) == 1
    await second.stop()


async def test_stopped_between_asking_and_hearing_the_task_follows_it(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver) -> None:
    """The daemon stops after the BMC took SimpleUpdate and made its task, before the answer
    (the task's URI) came back: the resumed step finds that task (its payload names our
    image) and follows it; the BMC is asked for the BIOS update once. Without the intent
    written first, the resumed step asked again (a second update on a real BMC)."""
    sim, url = bmc_sim
    sim.answer_hold = asyncio.Event()
    node = await new_node(make_node, url)
    steps = ["firmware_inventory", "firmware_update"]
    first = conductor(store, world, driver, settings(steps))
    await first.fire(node.id, Event.DEPLOY, actor="op")
    async with asyncio.timeout(10):
        while not sim.tasks:  # noqa: ASYNC110  (the BMC's own state, no event to wait on)
            await asyncio.sleep(0.02)
    await first.stop()  # gone before the BMC's answer
    record = ServiceRecord.from_facts((await store.nodes.get(node.id)).facts)
    assert record is not None and record.asking("BIOS") and len(sim.updates) == 1
    sim.answer_hold = None
    second = conductor(store, world, driver, settings(steps))
    assert await second.recover() == 1
    done = await wait_for_state(store, node.id, S.DEPLOYING)
    targets = [u["Targets"][0].rsplit("/", 1)[-1] for u in sim.updates]
    assert targets == ["BIOS", "NIC.Slot.1"], targets  # the BIOS once
    record = ServiceRecord.from_facts(done.facts)
    assert record is not None and record.tasks["BIOS"] == "/redfish/v1/TaskService/Tasks/1"
    history = await store.nodes.history(node.id)
    assert any("followed, not asked for again" in h.reason for h in history)
    await second.stop()


async def test_active_node_is_drained_serviced_and_back_through_the_gate(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver) -> None:
    sim, url = bmc_sim
    node = await make_node(S.ACTIVE, serial="A1", profile="gpu", bmc_password="password",
                           bmc=BmcEndpoint(driver="redfish", address=url, username="admin"))
    await store.nodes.merge_facts(node.id, simulated_facts("A1", "A1"))
    await world.ensure("A1", "boot", "power", "on")
    cond = conductor(store, world, driver, settings(ALL_STEPS))
    started = await cond.service(node.id, "fw", actor="op", reason="baseline")
    assert started.state == S.SERVICING
    done = await wait_for_state(store, node.id, S.ACTIVE)
    ledger = {op: eff for (k, op), (_c, eff) in world.ledger_blocking().items() if k == "A1"}
    assert ledger["slurm_drain"] == 1 and ledger["kube_cordon"] == 1
    assert ledger["slurm_resume"] == 1 and ledger["kube_uncordon"] == 1
    assert sim.versions["BIOS"] == "1.2.0"
    record = ServiceRecord.from_facts(done.facts)
    assert record is not None and record.drains and record.outcome == "passed"
    history = await store.nodes.history(node.id)
    reasons = [h.reason for h in history if h.event in ("service_drain", "service_step")]
    assert reasons[0].startswith("servicing: runbook fw") and "validation passed" in reasons
    await cond.stop()


async def test_images_come_from_our_boot_http_server(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver, boot) -> None:
    """The BMC fetches each image from the boot HTTP server's /artefacts/ (as a real BMC
    does, byte for byte); an image that is not there fails the update with the BMC's
    transfer message, and `config check`'s preflight finds it missing first."""
    sim, url = bmc_sim
    sim.fetch_images = True
    firmware = boot.artefacts / "firmware"
    firmware.mkdir()
    image = bytes(range(256)) * 64
    (firmware / "bios-1.2.0.bin").write_bytes(image)
    served = settings(["firmware_update"]).model_copy(
        update={"image_base_url": f"{boot.url}/artefacts/firmware"})
    node = await new_node(make_node, url)
    cond = conductor(store, world, driver, served)
    await cond.fire(node.id, Event.DEPLOY, actor="op")
    failed = await wait_for_state(store, node.id, S.SERVICE_FAILED)
    assert sim.fetched == {f"{boot.url}/artefacts/firmware/bios-1.2.0.bin": image}
    assert ("The transfer of the image "
            f"'{boot.url}/artefacts/firmware/nic-22.41.1.bin'") in (failed.last_error or "")
    await cond.stop()
    config = Settings(state_dir=boot.artefacts.parent / "state",
                      boot=BootSettings(artefacts_dir=boot.artefacts), servicing=served)
    with pytest.raises(ConfigError, match=r"firmware images missing .* gpu: nic-22.41.1.bin"):
        check_firmware_images(config, Preflight())
    (firmware / "nic-22.41.1.bin").write_bytes(b"nic")
    check_firmware_images(config, checked := Preflight())
    assert checked.checked == [f"firmware images: {firmware}"]
