"""The ``reboot`` and ``sanitise`` runbook steps through the conductor (issue 25).

``reboot`` on an active node: the ``redfish`` driver against the servicing BMC
(tests/sim/redfish_update.py): drained, one ForceRestart, the OS waited for with the repair
ladder's wait, the validation gate, back ``active``; a daemon stopped after the BMC took the
reset (its answer kept back) resumes without a second one. ``sanitise``: the simulated agent
erases every disk (one ``disk_erased`` row each), the node is re-deployed (``reimage``) and
comes back ``active`` through the deploy path (a new node's onboarding runbook likewise); a
disk no allowed method erases fails the step; a daemon stopped mid-erase asks the agent for
the same job (the step keyed by its run id); a runbook with ``sanitise`` before another step,
or a wave runbook with it, is refused by the configuration."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from provisioner.agent import erase
from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.redfish_service import SiteServicing
from provisioner.config.servicing import ServicingSettings
from provisioner.domain import BmcCredentials, BmcEndpoint, Node, Sanitised
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.service_record import ServiceRecord
from provisioner.lifecycle.states import Event, NodeState
from provisioner.lifecycle.steps import STEPS
from provisioner.simulation.drivers import FakeInstaller, simulated_facts
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state
from tests.integration.test_servicing import MANUAL, conductor
from tests.integration.test_servicing import bmc_sim as bmc_sim  # noqa: F401  (fixture)
from tests.integration.test_servicing import driver as driver  # noqa: F401  (fixture)

S = NodeState
FROZEN = Path(__file__).resolve().parents[1] / "fixtures" / "sanitise" / \
    "hdparm-I-security-frozen-tinyapps.txt"


def runbooks(onboarding: str | None = None, **books: list[str]) -> ServicingSettings:
    return ServicingSettings.model_validate({
        "runbooks": {name: {"steps": steps} for name, steps in books.items()},
        "profiles": {"gpu": {"onboarding_runbook": onboarding}}, "task_poll_s": 0.01})


async def _active(store: Store, world: SimWorld, make_node: Any, serial: str,
                  bmc: BmcEndpoint) -> Node:
    node: Node = await make_node(S.ACTIVE, serial=serial, profile="gpu",
                                 bmc_password="password", bmc=bmc)
    await store.nodes.merge_facts(node.id, simulated_facts(serial, serial))
    await world.ensure(serial, "boot", "power", "on")
    return node


async def _steps(store: Store, node_id: str) -> list[str]:
    return [h.reason for h in await store.nodes.history(node_id) if h.event == "service_step"]


async def test_reboot_power_cycles_once_and_waits_for_the_os(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver) -> None:
    sim, url = bmc_sim
    sim.power = "On"
    node = await _active(store, world, make_node, "RB1",
                         BmcEndpoint(driver="redfish", address=url, username="admin"))
    cond = conductor(store, world, driver, runbooks(rb=["firmware_inventory", "reboot"]))
    await cond.service(node.id, "rb", actor="op", reason="reboot")
    done = await wait_for_state(store, node.id, S.ACTIVE)
    await cond.stop()
    assert sim.resets == ["ForceRestart"]
    ledger = {op: calls for (k, op), (calls, _) in world.ledger_blocking().items() if k == "RB1"}
    # drained, the OS waited for once (FakeRepairs.wait_os), undrained
    assert (ledger["slurm_drain"], ledger["power_cycle"], ledger["slurm_resume"]) == (1, 1, 1)
    steps = await _steps(store, node.id)
    assert "reboot: power cycled through the BMC; the OS answers again" in steps
    assert steps[-1] == "validation passed"
    record = ServiceRecord.from_facts(done.facts)
    assert record is not None and record.outcome == "passed"
    assert [s for s, _, _ in record.results if ":" not in s] == ["firmware_inventory",
                                                                 "reboot"]


async def test_stopped_after_asking_for_the_reset_does_not_cycle_again(  # type: ignore[no-untyped-def]
        store, world, make_node, bmc_sim, driver) -> None:
    """The BMC resets the machine and keeps its answer back; the daemon stops. The intent
    was written before the request: the resumed step reads the node on and does not ask the
    BMC again (without the intent it would reset the node a second time)."""
    sim, url = bmc_sim
    sim.power, sim.reset_hold = "On", asyncio.Event()
    node = await _active(store, world, make_node, "RB2",
                         BmcEndpoint(driver="redfish", address=url, username="admin"))
    books = runbooks(rb=["reboot"])
    first = conductor(store, world, driver, books)
    await first.service(node.id, "rb", actor="op", reason="reboot")
    async with asyncio.timeout(10):
        while not sim.resets:  # noqa: ASYNC110  (the BMC's own state, no event to wait on)
            await asyncio.sleep(0.02)
    await first.stop()  # gone before the BMC's answer
    stopped = await store.nodes.get(node.id)
    assert stopped.state == S.SERVICING and "service:0:reboot:cycled" not in stopped.checkpoint
    sim.reset_hold = None
    second = conductor(store, world, driver, books)
    assert await second.recover() == 1
    await wait_for_state(store, node.id, S.ACTIVE)
    await second.stop()
    assert sim.resets == ["ForceRestart"]  # once
    steps = await _steps(store, node.id)
    assert "reboot: the power cycle asked for before a restart is not asked for again" in steps


def _ports(store: Store, world: SimWorld, books: ServicingSettings) -> Any:
    async def credentials(node: Node) -> BmcCredentials:
        return await store.nodes.credentials(node.id)

    return dataclasses.replace(fake_ports(world), servicing=SiteServicing(
        books, RedfishDriver(timeout_s=5), credentials))


async def test_sanitise_erases_every_disk_then_the_node_is_redeployed(  # type: ignore[no-untyped-def]
        store, world, make_node) -> None:
    ports = _ports(store, world, runbooks(handover=["reboot", "sanitise"]))
    node = await _active(store, world, make_node, "SN1", BmcEndpoint(driver="fake",
                                                                     address="SN1"))
    cond = Conductor(store.nodes, ports, MANUAL, steps=STEPS)
    started = await cond.service(node.id, "handover", actor="op", reason="new tenant")
    assert started.state == S.SERVICING
    done = await wait_for_state(store, node.id, S.ACTIVE)
    await cond.stop()
    history = await store.nodes.history(node.id)
    disks = [str(d["name"]) for d in simulated_facts("SN1", "SN1")["disks"]]
    erased = [h.reason for h in history if h.event == "disk_erased"]
    assert len(erased) == len(disks) and len(disks) >= 1
    assert all(any(d in r and "simulated" in r for r in erased) for d in disks), erased
    # servicing → deploying (reimage, not through the gate) → … → active
    moves = [(h.event, h.to_state) for h in history if h.to_state != h.from_state]
    assert moves[moves.index(("service", S.SERVICING)):] == [
        ("service", S.SERVICING), ("reimage", S.DEPLOYING), ("done", S.CONFIGURING),
        ("done", S.JOINING), ("done", S.VALIDATING), ("done", S.REGISTERING),
        ("done", S.ACTIVE)]
    steps = [h.reason for h in history if h.event == "service_step"]
    assert "validation passed" not in steps
    assert steps[-1].startswith(f"sanitise: {len(disks)} disks erased")
    ledger = {op: calls for (k, op), (calls, _) in world.ledger_blocking().items() if k == "SN1"}
    assert (ledger["slurm_drain"], ledger["wipe"], ledger["image_write"]) == (1, 1, 1)
    assert ledger.get("slurm_resume", 0) == 0  # not undrained: re-deployed, registered anew
    record = ServiceRecord.from_facts(done.facts)
    assert record is not None and record.outcome == "passed" and not record.netboot


@pytest.mark.parametrize("steps", [["sanitise", "reboot"], ["sanitise", "sanitise"]])
def test_sanitise_must_be_the_last_step(steps: list[str]) -> None:
    with pytest.raises(ValidationError, match="sanitise erases the node's disks, OS included: "
                                              "it must be the runbook's last step"):
        runbooks(bad=steps)


def test_a_wave_runbook_never_sanitises() -> None:
    with pytest.raises(ValidationError, match="wave_runbook 'handover' has a sanitise step"):
        ServicingSettings.model_validate({
            "runbooks": {"handover": {"steps": ["reboot", "sanitise"]}},
            "profiles": {"gpu": {"wave_runbook": "handover"}}})


async def test_an_onboarding_runbook_may_end_in_sanitise(  # type: ignore[no-untyped-def]
        store, world, make_node) -> None:
    """A new node (no OS yet): its disks erased, then on to deploying as every onboarding
    runbook goes (``onboarded``)."""
    ports = _ports(store, world, runbooks("wipe", wipe=["reboot", "sanitise"]))
    node = await make_node(S.INSPECTED, serial="SN3", profile="gpu", bmc_password="pw",
                           bmc=BmcEndpoint(driver="fake", address="SN3"))
    await store.nodes.merge_facts(node.id, simulated_facts("SN3", "SN3"))
    cond = Conductor(store.nodes, ports, MANUAL, steps=STEPS)
    await cond.fire(node.id, Event.DEPLOY, actor="op")
    await wait_for_state(store, node.id, S.ACTIVE)
    await cond.stop()
    history = await store.nodes.history(node.id)
    moves = [(h.event, h.to_state) for h in history if h.to_state != h.from_state]
    assert moves[1:4] == [("service", S.SERVICING), ("onboarded", S.DEPLOYING),
                         ("done", S.CONFIGURING)]
    assert any(h.event == "disk_erased" for h in history)
    steps = [h.reason for h in history if h.event == "service_step"]
    assert steps[0] == "reboot: power cycled through the BMC (a new node: no OS to wait for)"


class _FrozenSata(FakeInstaller):
    """The simulated agent, its SATA disk frozen (``hdparm -I`` of a frozen drive, the
    refusal the real agent writes for it; no overwrite allowed): the agent's report."""

    async def sanitise(self, node: Node, generation: str, skip: frozenset[str]) -> Sanitised:
        refusal = erase.ata_security(FROZEN.read_text()).refusal()
        error = ("no erase method worked (overwrite is not allowed for this profile): "
                 + refusal)
        return Sanitised.from_report({"ok": False, "error": f"sda: {error}", "disks": [
            {"device": "nvme0n1", "model": "SAMSUNG MZQL23T8HCLS", "serial": "S1",
             "method": "nvme-crypto-erase", "verified": True, "seconds": 2.0},
            {"device": "sda", "model": "INTEL SSDSC2KB480G8", "serial": "S2", "method": "",
             "verified": False, "seconds": 0.1, "error": error}]})


async def test_a_disk_no_allowed_method_erases_fails_the_step(  # type: ignore[no-untyped-def]
        store, world, make_node) -> None:
    ports = dataclasses.replace(_ports(store, world, runbooks(handover=["sanitise"])),
                                installer=_FrozenSata(world, delay_s=0.0, fail_rate=0.0))
    node = await _active(store, world, make_node, "SN2", BmcEndpoint(driver="fake",
                                                                     address="SN2"))
    cond = Conductor(store.nodes, ports, MANUAL, steps=STEPS)
    await cond.service(node.id, "handover", actor="op", reason="new tenant")
    failed = await wait_for_state(store, node.id, S.SERVICE_FAILED)
    await cond.stop()
    assert "sanitise failed: sda: no erase method worked" in (failed.last_error or "")
    assert "frozen" in (failed.last_error or "")
    history = await store.nodes.history(node.id)
    assert [h.reason.split(":")[0] for h in history if h.event == "disk_erased"] == [
        "nvme0n1 (SAMSUNG MZQL23T8HCLS serial S1)"]
    assert [h.reason.split(":")[0] for h in history if h.event == "disk_erase_failed"] == [
        "sda (INTEL SSDSC2KB480G8 serial S2)"]
    assert S.DEPLOYING not in {h.to_state for h in history}


class _SlowAgent(FakeInstaller):
    """The simulated agent, its erase held until ``release``; every job key it was asked
    for kept (a real agent answers a key it already ran from its memory)."""

    def __init__(self, world: SimWorld) -> None:
        super().__init__(world, delay_s=0.0, fail_rate=0.0)
        self.asked: list[str] = []
        self.release = asyncio.Event()

    async def sanitise(self, node: Node, generation: str, skip: frozenset[str]) -> Sanitised:
        self.asked.append(generation)
        await self.release.wait()
        return await super().sanitise(node, generation, skip)


async def test_stopped_during_the_erase_asks_the_agent_for_the_same_job(  # type: ignore[no-untyped-def]
        store, world, make_node) -> None:
    """The servicing step is keyed by its run id: a daemon stopped mid-erase asks the agent
    for the same job again (answered from its memory), never a second erase."""
    agent = _SlowAgent(world)
    ports = dataclasses.replace(_ports(store, world, runbooks(handover=["sanitise"])),
                                installer=agent)
    node = await _active(store, world, make_node, "SN4", BmcEndpoint(driver="fake",
                                                                     address="SN4"))
    first = Conductor(store.nodes, ports, MANUAL, steps=STEPS)
    await first.service(node.id, "handover", actor="op", reason="new tenant")
    async with asyncio.timeout(10):
        while not agent.asked:  # noqa: ASYNC110  (the agent's own state)
            await asyncio.sleep(0.02)
    await first.stop()
    agent.release.set()
    second = Conductor(store.nodes, ports, MANUAL, steps=STEPS)
    assert await second.recover() == 1
    await wait_for_state(store, node.id, S.ACTIVE)
    await second.stop()
    assert len(agent.asked) == 2 and agent.asked[0] == agent.asked[1]
    assert agent.asked[0].startswith("sanitise:")
