"""The validating step through the conductor, on a real SQLite store, with the real
FactsValidator reading facts built from the captures under tests/fixtures/topology/: a node
that passes, a node short of a GPU, an InfiniBand port at the wrong rate, an NVLink domain
held by one failed member (and released when it passes), a daemon restart while waiting."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from provisioner.config import LifecycleSettings, ValidationProfile, ValidationSettings
from provisioner.domain import Node
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.states import Event, NodeState
from provisioner.lifecycle.validation import HELD_EVENT, WAIT_EVENT, FactsValidator
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from provisioner.topology.parse_ibstat import parse_ibstat
from tests.conftest import fake_ports, wait_for_state
from tests.topology_support import nvsmi
from tests.unit.test_validation_checks import facts_ports

S, E = NodeState, Event
MANUAL = LifecycleSettings(auto_inspect=False, auto_deploy=False)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
A100_XML = (FIXTURES / "nvidia-smi" / "telegraf-a100-sxm4-v12.xml").read_text()
IB_PORTS = facts_ports(parse_ibstat(
    (FIXTURES / "infiniband" / "gpud-ibstat.47.0.h100.some.down.0.txt").read_text()))
CLIQUE = f"{nvsmi.CLUSTER_A}.1"
PROFILES = {
    "a100": ValidationProfile(gpu_count=1, gpu_model="A100", ib_rate_gbps=400,
                              ib_port_count=8),
    "hgx": ValidationProfile(gpu_count=8, gpu_model="H100"),
    "nvl": ValidationProfile(gpu_count=4, gpu_model="GB200", nvlink_domain=True,
                             nvlink_domain_nodes=3),
    "nvl2": ValidationProfile(gpu_count=4, nvlink_domain=True, nvlink_domain_nodes=2),
}


def validation(**overrides: Any) -> ValidationSettings:
    return ValidationSettings(profiles=PROFILES, domain_poll_interval_s=0.05, **overrides)


def conductor(store: Store, world: SimWorld, settings: ValidationSettings,
              lifecycle: LifecycleSettings = MANUAL, delay_s: float = 0.0) -> Conductor:
    ports = dataclasses.replace(fake_ports(world, delay_s=delay_s),
                                validator=FactsValidator(store.nodes, settings))
    return Conductor(store.nodes, ports, lifecycle)


async def node_with(make_node, store: Store, state: NodeState, profile: str,  # type: ignore[no-untyped-def]
                    report: dict[str, Any], **fields: Any) -> Node:
    node = await make_node(state, profile=profile, **fields)
    return await store.nodes.merge_facts(node.id, {"last_report": report})


def nvl_report(host: int, count: int = 4) -> dict[str, Any]:
    return {"nvidia_smi_xml": nvsmi.xml(nvsmi.gpus(host, count=count))}


async def rows(store: Store, node_id: str, event: str) -> list[str]:
    return [h.reason for h in await store.nodes.history(node_id) if h.event == event]


async def until_row(store: Store, node_id: str, event: str) -> None:
    async with asyncio.timeout(10):
        while True:
            if await rows(store, node_id, event):
                return
            await asyncio.sleep(0.05)


async def test_a_node_that_matches_its_profile_goes_on_to_slurm(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = conductor(store, world, validation())
    report = {"nvidia_smi_xml": A100_XML, "infiniband": IB_PORTS,
              "dcgm_diag": {"ran": True, "passed": True, "summary": "all tests passed"}}
    node = await node_with(make_node, store, S.JOINING, "a100", report)
    await cond.recover()
    done = await wait_for_state(store, node.id, S.ACTIVE)
    record = done.facts["validation"]
    assert record["passed"] is True and record["failures"] == []
    assert record["checks"] == ["gpus", "infiniband", "dcgm"] and record["clique"] is None
    assert done.facts["last_report"]["nvidia_smi_xml"] == A100_XML  # kept for the topology
    history = [(h.from_state, h.to_state) for h in await store.nodes.history(node.id)]
    assert ("joining", "validating") in history and ("validating", "registering") in history
    await cond.stop()


async def test_seven_of_eight_gpus_is_held_out_with_the_reason(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = conductor(store, world, validation())
    seven = nvsmi.gpus(7, count=7, cluster=nvsmi.ZERO, clique="0",
                       product="NVIDIA H100 80GB HBM3")
    node = await node_with(make_node, store, S.VALIDATING, "hgx",
                           {"nvidia_smi_xml": nvsmi.xml(seven)})
    await cond.recover()
    failed = await wait_for_state(store, node.id, S.VALIDATE_FAILED)
    assert failed.last_error == ("validation failed: gpu-count: saw 7 GPUs (nvidia-smi), "
                                 "expected 8")
    assert failed.facts["validation"]["passed"] is False
    await asyncio.sleep(0.2)
    assert (await store.nodes.get(node.id)).state is S.VALIDATE_FAILED  # held out
    await cond.stop()


async def test_an_infiniband_port_at_the_wrong_rate(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = conductor(store, world, validation())
    ports = [dict(hca, ports=[dict(p) for p in hca["ports"]]) for hca in IB_PORTS]
    (slow,) = [h for h in ports if h["device"] == "mlx5_4"]
    slow["ports"][0]["rate"] = "200 Gb/sec (4X HDR)"
    node = await node_with(make_node, store, S.VALIDATING, "a100",
                           {"nvidia_smi_xml": A100_XML, "infiniband": ports})
    await cond.recover()
    failed = await wait_for_state(store, node.id, S.VALIDATE_FAILED)
    assert failed.last_error == ("validation failed: ib-rate: mlx5_4 port 1 runs at 200 Gb/s "
                                 "(4xHDR), expected 400 Gb/s")
    await cond.stop()


async def test_one_failed_member_holds_its_nvlink_domain(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = conductor(store, world, validation())
    good = [await node_with(make_node, store, S.VALIDATING, "nvl", nvl_report(i),
                            hostname=f"nvl-{i:02d}") for i in (1, 2)]
    bad = await node_with(make_node, store, S.VALIDATING, "nvl", nvl_report(3, count=3),
                          hostname="nvl-03")
    await cond.recover()
    await wait_for_state(store, bad.id, S.VALIDATE_FAILED)
    for node in good:
        await until_row(store, node.id, HELD_EVENT)
    await asyncio.sleep(0.5)  # ten more polls: still held, no new rows
    for node in good:
        assert (await store.nodes.get(node.id)).state is S.VALIDATING
        (wait,) = await rows(store, node.id, WAIT_EVENT)  # one row, not one per poll
        assert wait.startswith(f"NVLink domain {CLIQUE}: ") and "nvl-03" in wait
        assert await rows(store, node.id, HELD_EVENT) == [
            f"NVLink domain {CLIQUE} held: nvl-03 failed validation: gpu-count: saw 3 GPUs "
            "(nvidia-smi), expected 4"]
    states = {h.to_state for n in good for h in await store.nodes.history(n.id)}
    assert "registering" not in states

    # The tray is fixed and its facts report again: retry, and the whole domain goes on.
    await store.nodes.merge_facts(bad.id, {"last_report": nvl_report(3)})
    await cond.fire(bad.id, E.RETRY, actor="op")
    for node in (*good, bad):
        done = await wait_for_state(store, node.id, S.ACTIVE)
        assert done.facts["validation"]["clique"] == CLIQUE
    await cond.stop()


async def test_restart_while_waiting_resumes_the_wait(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    first = conductor(store, world, validation())
    waiting = await node_with(make_node, store, S.VALIDATING, "nvl2", nvl_report(1),
                              hostname="nvl-01")
    await first.recover()
    await until_row(store, waiting.id, WAIT_EVENT)
    await first.stop()  # the daemon goes away while the node waits for its domain
    stopped = await store.nodes.get(waiting.id)
    assert stopped.state is S.VALIDATING and "validate-node" in stopped.checkpoint
    # Facts that would fail now: a resumed step must not check the node again.
    await store.nodes.merge_facts(waiting.id, {"last_report": nvl_report(1, count=2)})

    second = conductor(store, world, validation())
    assert await second.recover() == 1
    await asyncio.sleep(0.3)
    assert (await store.nodes.get(waiting.id)).state is S.VALIDATING
    other = await node_with(make_node, store, S.VALIDATING, "nvl2", nvl_report(2),
                            hostname="nvl-02")
    await second.recover()
    for node in (waiting, other):
        await wait_for_state(store, node.id, S.ACTIVE)
    assert await rows(store, waiting.id, WAIT_EVENT) == [
        f"NVLink domain {CLIQUE}: 1 of 2 nodes passed; waiting for 1 node(s) not yet seen"]
    await second.stop()


async def test_a_domain_wait_deadline_fails_the_node(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    cond = conductor(store, world, validation(domain_wait_timeout_s=0.3))
    node = await node_with(make_node, store, S.VALIDATING, "nvl2", nvl_report(1),
                           hostname="nvl-01")
    await cond.recover()
    failed = await wait_for_state(store, node.id, S.VALIDATE_FAILED)
    assert failed.last_error == (
        f"NVLink domain {CLIQUE}: 1 of 2 nodes passed; waiting for 1 node(s) not yet seen; "
        "gave up after 0.3 s (validation.domain_wait_timeout_s)")
    await cond.stop()


async def test_a_waiting_node_takes_no_slot_and_no_timeout(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    """One step at a time, 0.5 s per step: the first node waits for its domain far longer
    than that while the second, which it waits for, still gets through joining."""
    tight = LifecycleSettings(auto_inspect=False, auto_deploy=False, max_in_flight=1,
                              step_timeout_s=0.5)
    cond = conductor(store, world, validation(), tight, delay_s=0.2)
    first = await node_with(make_node, store, S.VALIDATING, "nvl2", nvl_report(1),
                            hostname="nvl-01", serial="W1")
    await cond.recover()
    await until_row(store, first.id, WAIT_EVENT)
    second = await node_with(make_node, store, S.JOINING, "nvl2", nvl_report(2),
                             hostname="nvl-02", serial="W2")
    await asyncio.sleep(0.6)  # past the step timeout: still waiting, not failed
    assert (await store.nodes.get(first.id)).state is S.VALIDATING
    await cond.recover()
    for node in (first, second):
        await wait_for_state(store, node.id, S.ACTIVE)
    await cond.stop()
