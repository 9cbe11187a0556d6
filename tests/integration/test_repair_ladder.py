"""The repair ladder through the conductor: a real SQLite store, the simulated machines (a
fault a rung clears, or none does), the checkpointed rungs resumed after a restart."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from provisioner.config import LifecycleSettings
from provisioner.config.health import HealthSettings
from provisioner.domain import BmcEndpoint
from provisioner.errors import Conflict
from provisioner.health.model import Action, Finding, HealthClass, Source
from provisioner.health.record import RepairRecord
from provisioner.health.records import Origin, Report
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.repair import RepairService, ladder_listener
from provisioner.lifecycle.repair_step import DRAINED, PASSED, gate_step, rung_step
from provisioner.lifecycle.states import Event, NodeState
from provisioner.simulation.drivers import FAULT, simulated_facts
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state

S = NodeState
MANUAL = LifecycleSettings(auto_inspect=False, auto_deploy=False)
XID79 = ("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the "
         "bus.")
ECC = "NVRM: Xid (PCI:0000:28:00): 48, pid=99, name=train, An uncorrectable double bit error"


def fake_bmc(serial: str) -> dict[str, Any]:
    return {"bmc": BmcEndpoint(driver="fake", address=serial), "bmc_password": "pw"}


def effects(world: SimWorld, key: str) -> dict[str, int]:
    return {op: eff for (k, op), (_calls, eff) in world.ledger_blocking().items() if k == key}


async def active_node(store: Store, world: SimWorld, make_node, serial: str,  # type: ignore[no-untyped-def]
                      **fields: Any):  # type: ignore[no-untyped-def]
    node = await make_node(S.ACTIVE, serial=serial, profile="gpu", **fake_bmc(serial),
                           **fields)
    await store.nodes.merge_facts(node.id, simulated_facts(serial, serial))
    await world.ensure(serial, "boot", "power", "on")  # an active node runs
    return node


async def until_tried(store: Store, node_id: str) -> None:
    async with asyncio.timeout(10):
        while True:
            record = RepairRecord.from_facts((await store.nodes.get(node_id)).facts)
            if record is not None and record.tried:
                return
            await asyncio.sleep(0.02)


@pytest.fixture
async def service(store: Store, world: SimWorld):  # type: ignore[no-untyped-def]
    cond = Conductor(store.nodes, fake_ports(world), MANUAL)
    yield RepairService(cond, store.nodes, HealthSettings(max_repairing_fraction=1.0))
    await cond.stop()


async def test_reset_clears_a_gpu_memory_fault_and_the_node_returns(  # type: ignore[no-untyped-def]
        store, world, make_node, service) -> None:
    node = await active_node(store, world, make_node, "L1")
    await world.ensure("L1", "inject", FAULT, "reset_gpu")
    finding = Finding(HealthClass.GPU_MEMORY, Action.RESET_GPU, ECC, Source.KERNEL_LOG,
                      "0000:28:00")
    decision = await service.open(node.id, finding)
    assert decision.started and decision.node.state == S.REPAIRING
    done = await wait_for_state(store, node.id, S.ACTIVE)
    # drained and cordoned with the same text, then resumed and uncordoned
    ledger = effects(world, "L1")
    assert ledger["slurm_drain"] == 1 and ledger["kube_cordon"] == 1
    assert ledger["slurm_resume"] == 1 and ledger["kube_uncordon"] == 1
    assert ledger["reset_gpu"] == 1 and "restart_os" not in ledger
    record = RepairRecord.from_facts(done.facts)
    assert record is not None and record.outcome == "passed"
    assert [(r.rung, r.result) for r in record.tried] == [("reset_gpu", "passed")]
    assert record.parts and record.parts[0]["pci_address"] == "0000:28:00.0"
    events = [h.event for h in await store.nodes.history(node.id)]
    assert events[-1] == "done" and "repair" in events and "repair_drain" in events


async def test_out_of_rungs_is_service_required_with_a_record(  # type: ignore[no-untyped-def]
        store, world, make_node, service) -> None:
    node = await active_node(store, world, make_node, "L2")
    await world.ensure("L2", "inject", FAULT, "never")
    decision = await service.open(node.id, Finding(HealthClass.GPU_LOST, Action.RESET_GPU,
                                                   XID79, Source.KERNEL_LOG, "0000:18:00"))
    assert decision.started
    stuck = await wait_for_state(store, node.id, S.SERVICE_REQUIRED)
    record = RepairRecord.from_facts(stuck.facts)
    assert record is not None and record.outcome == "service_required"
    assert [r.rung for r in record.tried] == ["reset_gpu", "restart_os", "power_cycle"]
    assert all(r.result.startswith("failed: simulated fault") for r in record.tried)
    assert record.serial == "L2" and XID79 in record.evidence
    assert "out of rungs" in stuck.last_error
    ledger = effects(world, "L2")
    assert ledger["power_off"] == 1 and ledger["power_on"] == 1  # the BMC rung
    assert "slurm_resume" not in ledger  # stays drained for the vendor
    # an operator starts it again after the part was swapped: the fault is gone
    await world.ensure("L2", "swap", FAULT, "")
    again = await service.start(node.id, None, actor="op", reason="GPU replaced")
    assert again.started
    await wait_for_state(store, node.id, S.ACTIVE)


async def test_cooldown_and_joined_evidence(store, world, make_node, service) -> None:  # type: ignore[no-untyped-def]
    node = await active_node(store, world, make_node, "L3")
    finding = Finding(HealthClass.NVLINK, Action.RESET_GPU, "Xid 74 NVLink", Source.KERNEL_LOG)
    assert (await service.open(node.id, finding)).started
    second = await service.open(node.id, Finding(HealthClass.NVLINK, Action.RESET_GPU,
                                                 "Xid 74 again", Source.KERNEL_LOG))
    assert second.outcome in ("joined", "cooldown")
    await wait_for_state(store, node.id, S.ACTIVE)  # no fault: the first gate passes
    flap = await service.open(node.id, finding)
    assert flap.outcome == "cooldown" and flap.node.state == S.ACTIVE
    other = await service.open(node.id, Finding(HealthClass.APPLICATION, Action.NONE, "xid 13",
                                                Source.KERNEL_LOG))
    assert other.outcome == "noted"


async def test_breaker_holds_automatic_repairs_until_reset(  # type: ignore[no-untyped-def]
        store, world, make_node) -> None:
    cond = Conductor(store.nodes, fake_ports(world, delay_s=0.3), MANUAL)
    service = RepairService(cond, store.nodes, HealthSettings(
        max_repairing_fraction=0.2, max_repairing_fraction_rack=1.0))
    nodes = [await active_node(store, world, make_node, f"B{i}", rack="r1") for i in range(10)]
    for n in nodes[:3]:
        await world.ensure(n.serial or "", "inject", FAULT, "never")
    finding = Finding(HealthClass.GPU_LOST, Action.RESET_GPU, XID79, Source.KERNEL_LOG)
    outcomes = [(await service.open(n.id, finding)).outcome for n in nodes[:4]]
    assert outcomes == ["started", "started", "breaker", "breaker"]
    state = service.breaker_state()
    assert state.tripped and "3 of 10" in state.reason and "(2 allowed)" in state.reason
    assert set(state.held) == {nodes[2].id, nodes[3].id}
    assert (await store.nodes.get(nodes[2].id)).state == S.ACTIVE
    # an operator's start passes the breaker
    assert (await service.start(nodes[2].id, finding, actor="op")).started
    await service.reset_breaker(actor="op", reason="bad driver rolled back")
    assert not service.breaker_state().tripped
    await cond.stop()


async def test_an_open_breaker_survives_a_restart(  # type: ignore[no-untyped-def]
        store, world, make_node) -> None:
    settings = HealthSettings(max_repairing_fraction=0.2, max_repairing_fraction_rack=1.0)
    cond = Conductor(store.nodes, fake_ports(world, delay_s=0.3), MANUAL)
    service = RepairService(cond, store.nodes, settings, breakers=store.findings)
    nodes = [await active_node(store, world, make_node, f"P{i}", rack="r1") for i in range(10)]
    for n in nodes[:3]:
        await world.ensure(n.serial or "", "inject", FAULT, "never")
    finding = Finding(HealthClass.GPU_LOST, Action.RESET_GPU, XID79, Source.KERNEL_LOG)
    outcomes = [(await service.open(n.id, finding)).outcome for n in nodes[:3]]
    assert outcomes == ["started", "started", "breaker"]
    tripped = service.breaker_state()
    # a restarted daemon (a new service on the same store) holds the next finding too
    again = RepairService(cond, store.nodes, settings, breakers=store.findings)
    assert await again.current_breaker() == tripped
    assert (await again.open(nodes[5].id, finding)).outcome == "breaker"
    assert set((await service.current_breaker()).held) == {nodes[2].id, nodes[5].id}
    await again.reset_breaker(actor="op", reason="bad driver rolled back")
    assert not (await service.current_breaker()).tripped  # reset for every daemon
    assert await store.findings.load_breaker() is None
    await cond.stop()


async def test_skip_stop_and_retry(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = Conductor(store.nodes, fake_ports(world, delay_s=0.3), MANUAL)
    service = RepairService(cond, store.nodes, HealthSettings(max_repairing_fraction=1.0))
    node = await active_node(store, world, make_node, "L4")
    await world.ensure("L4", "inject", FAULT, "power_cycle")
    finding = Finding(HealthClass.GPU_MEMORY, Action.RESET_GPU, ECC, Source.KERNEL_LOG)
    with pytest.raises(Conflict):
        await service.skip(node.id, "restart_os", actor="op")  # no ladder open yet
    assert (await service.open(node.id, finding)).started
    await service.skip(node.id, "restart_os", actor="op", reason="reboots do not help here")
    await until_tried(store, node.id)  # the reset tried, and its gate failed
    stopped = await service.stop(node.id, actor="op", reason="look first")
    assert stopped.state == S.REPAIR_FAILED and stopped.last_error == "look first"
    await cond.fire(node.id, Event.RETRY, actor="op")
    done = await wait_for_state(store, node.id, S.ACTIVE)
    record = RepairRecord.from_facts(done.facts)
    assert record is not None
    assert [(r.rung, r.result.split(":")[0]) for r in record.tried] == [
        ("reset_gpu", "failed"), ("restart_os", "skipped"), ("power_cycle", "passed")]
    ledger = effects(world, "L4")
    assert "restart_os" not in ledger and ledger["reset_gpu"] == 1
    await cond.stop()


async def test_a_skip_written_while_a_rung_runs_is_kept(  # type: ignore[no-untyped-def]
        store, world, make_node) -> None:
    """The operator skips the OS restart while the GPU reset runs: the ladder's writes of
    the reset's result are applied to the record as stored, the skip with it."""
    cond = Conductor(store.nodes, fake_ports(world, delay_s=0.3), MANUAL)
    service = RepairService(cond, store.nodes, HealthSettings(max_repairing_fraction=1.0))
    node = await active_node(store, world, make_node, "L7")
    await world.ensure("L7", "inject", FAULT, "power_cycle")
    finding = Finding(HealthClass.GPU_MEMORY, Action.RESET_GPU, ECC, Source.KERNEL_LOG)
    assert (await service.open(node.id, finding)).started
    async with asyncio.timeout(10):  # drained: the reset rung is running
        while True:
            if DRAINED in (await store.nodes.get(node.id)).checkpoint:
                break
            await asyncio.sleep(0.01)
    assert rung_step("reset_gpu") not in (await store.nodes.get(node.id)).checkpoint
    await service.skip(node.id, "restart_os", actor="op", reason="reboots do not help here")
    done = await wait_for_state(store, node.id, S.ACTIVE)
    record = RepairRecord.from_facts(done.facts)
    assert record is not None
    assert [(r.rung, r.result.split(":")[0]) for r in record.tried] == [
        ("reset_gpu", "failed"), ("restart_os", "skipped"), ("power_cycle", "passed")]
    assert "restart_os" not in effects(world, "L7")
    await cond.stop()


async def test_resume_at_the_rung_it_was_on(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    """A daemon killed after the GPU reset and its failed gate, during the OS restart: the
    next daemon does not drain or reset again; it restarts the OS and goes on."""
    node = await active_node(store, world, make_node, "K1")
    await world.ensure("K1", "inject", FAULT, "restart_os")
    finding = Finding(HealthClass.GPU_MEMORY, Action.RESET_GPU, ECC, Source.KERNEL_LOG)
    first = Conductor(store.nodes, fake_ports(world), MANUAL)
    service = RepairService(first, store.nodes, HealthSettings(max_repairing_fraction=1.0))
    await service.open(node.id, finding)
    await wait_for_state(store, node.id, S.ACTIVE)
    await first.stop()
    # the same ladder, as a killed daemon left it: written directly, as the crash tests do
    await world.ensure("K1", "inject-again", FAULT, "restart_os")
    row = await store.nodes.get(node.id)
    record = RepairRecord.from_facts(row.facts)
    assert record is not None
    from dataclasses import replace
    half = replace(record, tried=record.tried[:1], outcome="", ended_at="")
    assert half.tried[0].rung == "reset_gpu" and half.tried[0].passed is False
    killed = await store.nodes.transition(row, to_state=S.REPAIRING, event=str(Event.REPAIR),
                                          actor="test")
    await store.nodes.merge_facts(node.id, {"repair": half.to_facts()})
    await store.nodes.save_checkpoint(await store.nodes.get(node.id), [
        DRAINED, rung_step("reset_gpu"), gate_step("reset_gpu")])
    before = effects(world, "K1")
    second = Conductor(store.nodes, fake_ports(world), MANUAL)
    assert killed.state == S.REPAIRING and await second.recover() == 1
    done = await wait_for_state(store, node.id, S.ACTIVE)
    after = effects(world, "K1")
    assert after["slurm_drain"] == before["slurm_drain"]  # not drained again
    assert after["reset_gpu"] == before["reset_gpu"]  # not reset again
    assert after["restart_os"] == before.get("restart_os", 0) + 1
    closed = RepairRecord.from_facts(done.facts)
    assert closed is not None and [r.rung for r in closed.tried] == ["reset_gpu", "restart_os"]
    await second.stop()


async def test_a_finding_from_the_intake_walks_the_ladder(  # type: ignore[no-untyped-def]
        store, world, make_node, service) -> None:
    """``HealthFindings`` (the API, Alertmanager, the Slurm and Kubernetes syncs) → the
    ladder, as the daemon wires them (``ladder_listener``): an opened finding starts it, a
    repeat of the open one does not start a second, a silenced class starts none."""
    health = HealthFindings(store.findings, service._conductor)
    health.add_listener(ladder_listener(service))
    node = await active_node(store, world, make_node, "L9")
    quiet = await active_node(store, world, make_node, "L10")
    await world.ensure("L9", "inject", FAULT, "reset_gpu")
    ecc = Report(HealthClass.GPU_MEMORY, Action.RESET_GPU, ECC, "0000:28:00")
    await health.report(node.id, Origin.ALERTMANAGER, [ecc], actor="test")
    await health.report(node.id, Origin.ALERTMANAGER, [ecc], actor="test")  # a repeat
    done = await wait_for_state(store, node.id, S.ACTIVE)
    record = RepairRecord.from_facts(done.facts)
    assert record is not None and record.outcome == PASSED, record
    assert effects(world, "L9")["reset_gpu"] == 1  # one ladder, one reset
    await health.silence(quiet.id, 3600, reason="vendor on site", actor="test",
                         cls=HealthClass.GPU_MEMORY)
    await health.report(quiet.id, Origin.ALERTMANAGER, [ecc], actor="test")
    await asyncio.sleep(0.2)
    assert (await store.nodes.get(quiet.id)).state == S.ACTIVE
    assert "slurm_drain" not in effects(world, "L10")
