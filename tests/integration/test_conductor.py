"""The conductor against a real SQLite store and the simulated world."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from provisioner.bmc.fake import fake_bmc_factory
from provisioner.config import LifecycleSettings
from provisioner.domain import BmcEndpoint, Node, Sanitised
from provisioner.errors import Conflict, InvalidTransition, RetryableError
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.rack_limit import RackBmcLimit
from provisioner.lifecycle.states import Event, NodeState
from provisioner.simulation.drivers import simulated_facts
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state

S, E = NodeState, Event
MANUAL = LifecycleSettings(auto_inspect=False, auto_deploy=False)


def fake_bmc(serial: str) -> dict[str, Any]:
    return {"bmc": BmcEndpoint(driver="fake", address=serial), "bmc_password": "pw"}


def effects(world: SimWorld, key: str) -> dict[str, int]:
    return {op: eff for (k, op), (_calls, eff) in world.ledger_blocking().items() if k == key}


def calls(world: SimWorld, key: str) -> dict[str, int]:
    return {op: c for (k, op), (c, _eff) in world.ledger_blocking().items() if k == key}


async def test_full_lifecycle_by_policy(store: Store, world: SimWorld, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = Conductor(store.nodes, fake_ports(world), LifecycleSettings())
    node = await make_node(S.ENROLLED, profile="gpu", serial="A1", **fake_bmc("A1"))
    await cond.recover()  # policy picks up the waiting node
    await wait_for_state(store, node.id, S.ACTIVE)
    history = await store.nodes.history(node.id)
    assert [h.to_state for h in history] == [
        "enrolled", "inspecting", "inspected", "deploying", "configuring", "joining",
        "validating", "registering", "active"]
    assert [h.seq for h in history] == list(range(1, 10))
    assert {h.actor for h in history[1:]} == {"policy", "conductor"}
    # inspect: on, off; deploy: on (netboot), then off and on into the written disk
    assert effects(world, "A1") == {"bootdev": 2, "power_on": 3, "power_off": 2,
                                    "image_write": 1, "configure": 1, "kube_join": 1,
                                    "slurm_register": 1}
    done = await store.nodes.get(node.id)
    assert done.facts["gpus"][0]["device"] == "0x2330"
    assert done.checkpoint == () and done.last_error == ""
    assert done.power_state == "on"  # stored with the power-on-disk checkpoint
    await cond.stop()


async def test_without_profile_policy_stops_at_inspected(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = Conductor(store.nodes, fake_ports(world), LifecycleSettings())
    node = await make_node(S.ENROLLED)
    await cond.recover()
    await wait_for_state(store, node.id, S.INSPECTED)
    await asyncio.sleep(0.1)
    assert (await store.nodes.get(node.id)).state == S.INSPECTED
    await cond.stop()


async def test_resume_skips_checkpointed_substeps(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    node = await make_node(S.DEPLOYING, serial="R1", **fake_bmc("R1"))
    await world.ensure("R1", "power_on", "power", "on")  # the killed daemon had powered it on
    await store.nodes.save_checkpoint(node, ["run:earlier", "bootdev-pxe",
                                             "power-off-for-netboot", "power-on"])
    cond = Conductor(store.nodes, fake_ports(world), MANUAL)
    assert await cond.recover() == 1
    await wait_for_state(store, node.id, S.ACTIVE)
    # the netboot's power-on is not called again on resume; the one more is the power-on
    # into the written disk
    assert calls(world, "R1")["power_on"] == 2
    assert "bootdev" not in calls(world, "R1") or calls(world, "R1")["bootdev"] == 1
    assert effects(world, "R1")["image_write"] == 1
    assert await world.get("R1", "disk") == "earlier"  # the run id survived the restart
    await cond.stop()


async def test_abort_cancels_step_and_retry_runs_it_again(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = Conductor(store.nodes, fake_ports(world, delay_s=0.3), MANUAL)
    node = await make_node(S.INSPECTED, serial="B1", **fake_bmc("B1"))
    await cond.fire(node.id, E.DEPLOY, actor="op")
    await asyncio.sleep(0.1)
    aborted = await cond.fire(node.id, E.ABORT, actor="op", reason="wrong image")
    assert aborted.state == S.DEPLOY_FAILED
    assert aborted.last_error == "wrong image"
    await asyncio.sleep(0.5)  # the cancelled step must not report back
    assert (await store.nodes.get(node.id)).state == S.DEPLOY_FAILED
    await cond.fire(node.id, E.RETRY, actor="op")
    await wait_for_state(store, node.id, S.ACTIVE, timeout_s=20)
    history = await store.nodes.history(node.id)
    assert [h.event for h in history] == ["enroll", "deploy", "abort", "retry", "done", "done",
                                          "done", "done", "done"]
    await cond.stop()


async def test_failure_records_reason_and_retry_succeeds(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    class FlakyInspector:
        attempts = 0

        async def inspect(self, node: Node) -> dict[str, Any]:
            self.attempts += 1
            if self.attempts == 1:
                raise RetryableError("agent did not call back")
            return {"cpu": {"cores": 4}}

    base = fake_ports(world)
    ports = Ports(bmc=base.bmc, inspector=FlakyInspector(), installer=base.installer,
                  kube=base.kube, slurm=base.slurm)
    cond = Conductor(store.nodes, ports, MANUAL)
    node = await make_node(S.ENROLLED)
    await cond.fire(node.id, E.INSPECT, actor="op")
    failed = await wait_for_state(store, node.id, S.INSPECT_FAILED)
    assert failed.last_error == "agent did not call back"
    assert (await store.nodes.history(node.id))[-1].reason == "agent did not call back"
    await cond.fire(node.id, E.RETRY, actor="op")
    done = await wait_for_state(store, node.id, S.INSPECTED)
    assert done.facts == {"cpu": {"cores": 4}} and done.last_error == ""
    await cond.stop()


async def test_unknown_bmc_driver_fails_the_step_with_reason(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    from provisioner.bmc.registry import BmcRegistry

    base = fake_ports(world)
    ports = Ports(bmc=BmcRegistry({}), inspector=base.inspector, installer=base.installer,
                  kube=base.kube, slurm=base.slurm)
    cond = Conductor(store.nodes, ports, MANUAL)
    node = await make_node(S.ENROLLED, bmc=BmcEndpoint(driver="ipmi", address="10.0.0.9"))
    await cond.fire(node.id, E.INSPECT, actor="op")
    failed = await wait_for_state(store, node.id, S.INSPECT_FAILED)
    assert "BMC driver 'ipmi' is not available" in failed.last_error
    await cond.stop()


async def test_step_timeout(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    settings = LifecycleSettings(auto_inspect=False, auto_deploy=False, step_timeout_s=0.2)
    cond = Conductor(store.nodes, fake_ports(world, delay_s=2), settings)
    node = await make_node(S.ENROLLED)
    await cond.fire(node.id, E.INSPECT, actor="op")
    failed = await wait_for_state(store, node.id, S.INSPECT_FAILED)
    assert failed.last_error == "inspecting timed out after 0.2 s"
    await cond.stop()


async def test_maintenance_holds_the_next_substep(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = Conductor(store.nodes, fake_ports(world, delay_s=0.2), MANUAL)
    node = await make_node(S.ENROLLED, serial="M1", **fake_bmc("M1"))
    await cond.fire(node.id, E.INSPECT, actor="op")
    await asyncio.sleep(0.05)
    await cond.set_maintenance(node.id, True, actor="op", reason="swap PSU")
    async with asyncio.timeout(5):
        while True:
            if cond.step_status(node.id) == "held":
                break
            await asyncio.sleep(0.02)
    held = await store.nodes.get(node.id)
    assert held.state == S.INSPECTING and held.maintenance_reason == "swap PSU"
    with pytest.raises(Conflict, match="maintenance"):
        await cond.fire(node.id, E.RETRY, actor="op")
    await cond.set_maintenance(node.id, False, actor="op", reason="")
    await wait_for_state(store, node.id, S.INSPECTED)
    events = [h.event for h in await store.nodes.history(node.id)]
    assert events == ["enroll", "inspect", "maintenance_on", "maintenance_off", "done"]
    await cond.stop()


async def test_budget_queues_work_instead_of_rejecting(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    base = fake_ports(world, delay_s=0.1)

    class CountingInstaller:
        """Wraps the fake installer to observe how many image writes overlap."""

        now = peak = 0

        async def deploy_image(self, node: Node, generation: str) -> None:
            self.now += 1
            self.peak = max(self.peak, self.now)
            try:
                await base.installer.deploy_image(node, generation)
            finally:
                self.now -= 1

        async def configure(self, node: Node, generation: str) -> None:
            await base.installer.configure(node, generation)

        async def collect_facts(self, node: Node, generation: str) -> None:
            await base.installer.collect_facts(node, generation)

        async def sanitise(self, node: Node, generation: str,
                           skip: frozenset[str]) -> Sanitised:
            return await base.installer.sanitise(node, generation, skip)

        async def build_arrays(self, node: Node, generation: str,
                               arrays: list[dict[str, Any]]) -> dict[str, Any]:
            return await base.installer.build_arrays(node, generation, arrays)

    installer = CountingInstaller()
    ports = Ports(bmc=base.bmc, inspector=base.inspector, installer=installer,
                  kube=base.kube, slurm=base.slurm)
    settings = LifecycleSettings(auto_inspect=False, auto_deploy=False, max_deploying=2)
    cond = Conductor(store.nodes, ports, settings)
    nodes = [await make_node(S.INSPECTED, serial=f"Q{i}", **fake_bmc(f"Q{i}"))
             for i in range(5)]
    for node in nodes:
        await cond.fire(node.id, E.DEPLOY, actor="op")  # none refused
    statuses = [cond.step_status(n.id) for n in nodes]
    assert statuses.count("queued") >= 3
    for node in nodes:
        await wait_for_state(store, node.id, S.ACTIVE, timeout_s=30)
    assert installer.peak == 2
    await cond.stop()


async def test_invalid_transition_names_state_and_allowed(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = Conductor(store.nodes, fake_ports(world), MANUAL)
    node = await make_node(S.ACTIVE)
    with pytest.raises(InvalidTransition) as info:
        await cond.fire(node.id, E.INSPECT, actor="op")
    assert info.value.state == "active" and info.value.allowed == ["deploy", "repair", "retire"]
    assert len(await store.nodes.history(node.id)) == 1  # nothing written
    await cond.stop()


async def test_graceful_stop_lets_the_running_substep_checkpoint(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = Conductor(store.nodes, fake_ports(world, delay_s=0.3), MANUAL)
    node = await make_node(S.ENROLLED, serial="G1", **fake_bmc("G1"))
    await cond.fire(node.id, E.INSPECT, actor="op")
    await asyncio.sleep(0.1)  # inside a sub-step (collect-facts, unless the machine is slow)
    await cond.stop(grace_s=5)
    stopped = await store.nodes.get(node.id)
    assert stopped.state == S.INSPECTING
    # the running sub-step finished and was checkpointed; the step went no further
    order = ("bootdev-pxe", "power-off-for-netboot", "power-on", "collect-facts", "power-off")
    done = stopped.checkpoint
    assert 1 <= len(done) < len(order) and done == order[:len(done)], done
    resumed = Conductor(store.nodes, fake_ports(world), MANUAL)
    await resumed.recover()
    await wait_for_state(store, node.id, S.INSPECTED)
    assert effects(world, "G1")["power_off"] == 1
    await resumed.stop()


async def test_retire_from_active(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = Conductor(store.nodes, fake_ports(world), MANUAL)
    node = await make_node(S.ACTIVE, serial="T1", **fake_bmc("T1"))
    await world.ensure("T1", "kube_join", "kube", "node")
    await cond.fire(node.id, E.RETIRE, actor="op", reason="end of life")
    await wait_for_state(store, node.id, S.RETIRED)
    assert await world.get("T1", "kube") == "" and await world.get("T1", "power") == "off"
    erased = [h.reason for h in await store.nodes.history(node.id) if h.event == "disk_erased"]
    disks = simulated_facts("T1", "T1")["disks"]  # one row per disk, each with its method
    assert len(erased) == len(disks) >= 1 and all("erased by simulated" in r for r in erased)
    await cond.stop()


async def test_reprovisioning_an_active_node_takes_it_out_of_service_first(  # type: ignore[no-untyped-def]
        store, world, make_node) -> None:
    """Re-deploying an active node (handed to Slurm and Kubernetes) drains and removes it
    from both before its disk is rewritten; a first deploy has nothing to remove."""
    cond = Conductor(store.nodes, fake_ports(world), MANUAL)
    node = await make_node(S.INSPECTED, profile="gpu", serial="P1", **fake_bmc("P1"))
    await cond.fire(node.id, E.DEPLOY, actor="op")
    await wait_for_state(store, node.id, S.ACTIVE)
    assert "slurm_remove" not in calls(world, "P1") and "kube_remove" not in calls(world, "P1")
    assert await world.get("P1", "slurm") != "" and await world.get("P1", "kube") != ""
    await cond.fire(node.id, E.DEPLOY, actor="op", reason="new image")
    await wait_for_state(store, node.id, S.ACTIVE)
    assert (effects(world, "P1")["slurm_remove"], effects(world, "P1")["kube_remove"]) == (1, 1)
    assert effects(world, "P1")["image_write"] == 2  # one per deployment
    history = [h.to_state for h in await store.nodes.history(node.id)]
    assert history.count("deploying") == 2 and history[-1] == "active"
    await cond.stop()


async def test_a_stale_start_never_blocks_the_next_step(  # type: ignore[no-untyped-def]
    store, world, make_node, monkeypatch
) -> None:
    """Regression (found by bench/rack_bench.py: 2 of 1,000 nodes stuck): recover() started a
    step from a stale snapshot; that task queued behind a full budget and, while it waited,
    blocked the start of the node's real next step."""
    gate = asyncio.Event()
    base = fake_ports(world)

    class BlockedInspector:
        async def inspect(self, node: Node) -> dict[str, Any]:
            await gate.wait()
            return {}

    ports = Ports(bmc=base.bmc, inspector=BlockedInspector(), installer=base.installer,
                  kube=base.kube, slurm=base.slurm)
    settings = LifecycleSettings(auto_inspect=False, auto_deploy=False, max_inspecting=1)
    cond = Conductor(store.nodes, ports, settings)
    holder = await make_node(S.ENROLLED)
    await cond.fire(holder.id, E.INSPECT, actor="op")  # takes the only inspecting slot
    node = await make_node(S.INSPECTING, serial="ST1", **fake_bmc("ST1"))
    stale = await store.nodes.get(node.id)
    await store.nodes.transition(stale, to_state=S.DEPLOYING, event="done", actor="test")

    async def stale_snapshot(states: Any) -> list[Node]:
        return [stale] if S.INSPECTING in set(states) else []

    monkeypatch.setattr(store.nodes, "in_states", stale_snapshot)
    real_transition = store.nodes.transition
    injected = []

    async def transition_then_recover(node_arg: Node, **kw: Any) -> Node:
        result = await real_transition(node_arg, **kw)
        if node_arg.id == node.id and kw["to_state"] is S.CONFIGURING and not injected:
            injected.append(True)  # recover() runs in the window before configuring starts
            await cond.recover()
        return result

    monkeypatch.setattr(store.nodes, "transition", transition_then_recover)
    await cond.fire(node.id, E.ABORT, actor="op")
    await cond.fire(node.id, E.RETRY, actor="op")  # deploying -> configuring -> ... -> active
    await wait_for_state(store, node.id, S.ACTIVE, timeout_s=20)
    assert injected
    gate.set()
    await wait_for_state(store, holder.id, S.INSPECTED)
    await cond.stop()


async def test_a_step_cancelled_and_still_unwinding_never_blocks_its_restart(
        store: Store, world: SimWorld, make_node) -> None:  # type: ignore[no-untyped-def]
    """Regression (tests/e2e/test_ha_partition.py, 2 of 30 nodes stuck after a PostgreSQL
    restart): the daemon stood down (every step cancelled), and its take-over claimed a
    node again while that node's cancelled step was still unwinding; the new start saw a
    step "running" and did nothing, and the lease was renewed for a step nobody ran."""
    cond = Conductor(store.nodes, fake_ports(world), LifecycleSettings(auto_deploy=False))
    node = await make_node(S.INSPECTING, serial="UW1", **fake_bmc("UW1"))
    unwound = asyncio.Event()

    async def unwinding() -> None:
        try:
            await asyncio.sleep(3600)
        finally:  # e.g. a sub-step's clean-up awaiting the store that just came back
            await unwound.wait()

    old = asyncio.create_task(unwinding())
    await asyncio.sleep(0)
    old.cancel()
    await asyncio.sleep(0)
    assert not old.done() and old.cancelling()
    cond._running[node.id] = (S.INSPECTING, old)  # what stand_down leaves behind
    cond._start(await store.nodes.get(node.id))
    assert cond._running[node.id][1] is not old
    await wait_for_state(store, node.id, S.INSPECTED, timeout_s=20)
    unwound.set()
    with pytest.raises(asyncio.CancelledError):
        await old
    await cond.stop()


async def test_a_profile_s_rack_limit_bounds_how_many_bmcs_of_a_rack_are_driven(
        store: Store, world: SimWorld, make_node) -> None:  # type: ignore[no-untyped-def]
    """GB200/GB300: with ``[bmc.profile_rack_concurrency] gb200 = 2``, eight trays of one
    NVL72 rack inspected at once never have more than two BMC operations in flight; the
    nodes of another rack and profile are not held back by it."""
    limit = RackBmcLimit(None, {"gb200": 2})
    ports = dataclasses.replace(fake_ports(world), bmc=fake_bmc_factory(world, delay_s=0.05),
                                rack_bmc=limit)
    cond = Conductor(store.nodes, ports, LifecycleSettings(auto_deploy=False))
    trays = [await make_node(S.ENROLLED, profile="gb200", rack="nvl72-a", serial=f"G{i}",
                             **fake_bmc(f"G{i}")) for i in range(8)]
    others = [await make_node(S.ENROLLED, profile="hgx", rack="hgx-b", serial=f"H{i}",
                              **fake_bmc(f"H{i}")) for i in range(4)]
    await cond.recover()
    for node in trays + others:
        await wait_for_state(store, node.id, S.INSPECTED, timeout_s=30)
    assert limit.max_in_flight == {"nvl72-a": 2}  # reached, never passed; hgx-b unlimited
    assert all(effects(world, f"G{i}")["power_off"] >= 1 for i in range(8))
    await cond.stop()
