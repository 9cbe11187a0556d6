"""The validating step with a node whose NVSwitch fabric is still training (issue 22): the
facts are collected again (``Installer.collect_facts``, the ``facts.yml`` run) and judged
again until the fabric is up, or the settle deadline holds the node, naming state and
status; a daemon restarted meanwhile keeps the deadline. Real SQLite store, real conductor,
real FactsValidator; the reports are the H200 capture of 2026-11-27 and its fabric-edited
twins (tests/fixtures/topology/nvidia-smi/README.md)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from provisioner.config import LifecycleSettings, ValidationProfile, ValidationSettings
from provisioner.domain import Node
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.steps import SETTLE_SINCE
from provisioner.lifecycle.validation import SETTLE_EVENT, FactsValidator
from provisioner.simulation.drivers import FakeInstaller
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state

S = NodeState
SMI = Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "nvidia-smi"
H200_UUID = "GPU-1bcdffa9-0bbf-b6cf-8af8-d99b8a4236b4"
MANUAL = LifecycleSettings(auto_inspect=False, auto_deploy=False)


def report(name: str) -> dict[str, Any]:
    return {"nvidia_smi_xml": (SMI / f"h200-580.159.04-q-x.{name}.xml").read_text()}


class ReportingInstaller(FakeInstaller):
    """The simulated installer, whose facts run reports the next of ``reports`` for the
    node the way the agent API stores a report (``last_report``), then the last one again."""

    def __init__(self, world: SimWorld, store: Store, reports: list[dict[str, Any]]) -> None:
        super().__init__(world, delay_s=0.0, fail_rate=0.0)
        self._store = store
        self.reports = reports
        self.runs = 0

    async def collect_facts(self, node: Node, generation: str) -> None:
        self.runs += 1
        nxt = self.reports.pop(0) if len(self.reports) > 1 else self.reports[0]
        await self._store.nodes.merge_facts(node.id, {"last_report": nxt})


def conductor(store: Store, world: SimWorld, installer: ReportingInstaller,
              **settle: float) -> Conductor:
    settings = ValidationSettings(
        profiles={"h200": ValidationProfile(gpu_count=1, gpu_model="H200")}, **settle)
    ports = dataclasses.replace(fake_ports(world), installer=installer,
                                validator=FactsValidator(store.nodes, settings))
    return Conductor(store.nodes, ports, MANUAL)


async def settling_node(make_node, store: Store) -> Node:  # type: ignore[no-untyped-def]
    node = await make_node(S.VALIDATING, profile="h200", hostname="hgx-01")
    return await store.nodes.merge_facts(node.id, {"last_report": report("fabric-in-progress")})


async def settle_rows(store: Store, node_id: str) -> list[str]:
    return [h.reason for h in await store.nodes.history(node_id) if h.event == SETTLE_EVENT]


async def until_settling(store: Store, node_id: str) -> None:
    async with asyncio.timeout(10):
        while True:
            if await settle_rows(store, node_id):
                return
            await asyncio.sleep(0.02)


async def test_a_fabric_that_comes_up_while_settling_passes(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    installer = ReportingInstaller(world, store, [report("fabric-in-progress"),
                                                  report("fabric-completed")])
    cond = conductor(store, world, installer, fabric_settle_timeout_s=30,
                     fabric_settle_interval_s=0.05)
    node = await settling_node(make_node, store)
    await cond.recover()
    done = await wait_for_state(store, node.id, S.ACTIVE)
    assert installer.runs == 2  # still training at the first collection, up at the second
    assert done.facts["validation"]["passed"] is True
    assert done.facts["validation"]["checks"] == ["gpus", "nvlink-fabric", "gpu-recovery"]
    (row,) = await settle_rows(store, node.id)  # one row, not one per collection
    assert row.startswith(f"nvlink-fabric: GPU 0 ({H200_UUID}): fabric state In Progress, "
                          "status N/A, expected Completed, Success; collecting the facts "
                          "again every 0.05 s until ")
    await cond.stop()


async def test_a_fabric_never_up_is_held_at_the_deadline(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    installer = ReportingInstaller(world, store, [report("fabric-in-progress")])
    cond = conductor(store, world, installer, fabric_settle_timeout_s=0.3,
                     fabric_settle_interval_s=0.05)
    node = await settling_node(make_node, store)
    await cond.recover()
    failed = await wait_for_state(store, node.id, S.VALIDATE_FAILED)
    assert failed.last_error == (
        f"validation failed: nvlink-fabric: GPU 0 ({H200_UUID}): fabric state In Progress, "
        "status N/A, expected Completed, Success; nvlink-fabric: still training after 0.3 s "
        "(validation.fabric_settle_timeout_s): is Fabric Manager running?")
    assert installer.runs >= 2
    assert failed.facts["validation"]["settling"] is False
    await cond.stop()


async def test_a_lasting_fault_is_held_without_collecting(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    installer = ReportingInstaller(world, store, [report("fabric-completed")])
    cond = conductor(store, world, installer, fabric_settle_timeout_s=30,
                     fabric_settle_interval_s=0.05)
    node = await make_node(S.VALIDATING, profile="h200", hostname="hgx-02")
    await store.nodes.merge_facts(node.id,
                                  {"last_report": report("fabric-insufficient-resources")})
    await cond.recover()
    failed = await wait_for_state(store, node.id, S.VALIDATE_FAILED)
    assert failed.last_error == (
        f"validation failed: nvlink-fabric: GPU 0 ({H200_UUID}): fabric state Completed, "
        "status Insufficient Resources, expected Completed, Success")
    assert installer.runs == 0 and await settle_rows(store, node.id) == []
    await cond.stop()


async def test_a_restart_while_settling_keeps_the_deadline(store, world, make_node) -> None:  # type: ignore[no-untyped-def]
    installer = ReportingInstaller(world, store, [report("fabric-in-progress")])
    first = conductor(store, world, installer, fabric_settle_timeout_s=1.0,
                      fabric_settle_interval_s=0.05)
    node = await settling_node(make_node, store)
    await first.recover()
    await until_settling(store, node.id)
    await first.stop()  # the daemon goes away while the node settles
    stopped = await store.nodes.get(node.id)
    assert stopped.state is S.VALIDATING
    (since,) = [c for c in stopped.checkpoint if c.startswith(SETTLE_SINCE)]
    await asyncio.sleep(1.1)  # the deadline passes while no daemon runs

    runs = installer.runs
    second = conductor(store, world, installer, fabric_settle_timeout_s=1.0,
                       fabric_settle_interval_s=0.05)
    assert await second.recover() == 1
    failed = await wait_for_state(store, node.id, S.VALIDATE_FAILED)
    assert installer.runs == runs  # not started over: no new collection
    assert "still training after 1 s" in failed.last_error
    assert [c for c in failed.checkpoint if c.startswith(SETTLE_SINCE)] in ([since], [])
    await second.stop()
