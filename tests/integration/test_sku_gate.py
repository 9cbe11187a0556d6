"""The SKU gate at inspection, through the conductor and the REST API on a real SQLite store:
the real FactsValidator judges the inspection facts (the simulated HGX H100 ramdisk's, and the
real collector's on a sysfs tree with 10de:2330) against the profile before anything is
installed. A mismatch stays in ``inspected`` with every reason, is not deployed by the policy
nor by an operator, until an operator overrides the gate for that node.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from provisioner.agent.collect import collect
from provisioner.config import LifecycleSettings, ValidationProfile, ValidationSettings
from provisioner.domain import NewNode, Node, Role
from provisioner.errors import Conflict
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.states import Event, NodeState
from provisioner.lifecycle.validation import FactsValidator
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from provisioner.validation.sku import HELD_EVENT, NOTE_EVENT, OVERRIDE_EVENT
from tests.conftest import fake_ports, wait_for_state
from tests.integration.test_api import running_api
from tests.topology_support.ib_sysfs import load_modules, sysfs_from_ibstat
from tests.unit.test_gpu_ids import sysfs_tree

S, E = NodeState, Event
AUTO = LifecycleSettings(auto_inspect=True, auto_deploy=True)
PROFILES = {
    # the simulated ramdisk reports 8x H100 SXM5, 2 TiB, 8 HCAs at 400, one 3.84 TB NVMe
    "hgx-h100": ValidationProfile(gpu_count=8, gpu_model="H100", ib_port_count=8,
                                  ib_rate_gbps=400, memory_min_gib=1900, disk_count=1,
                                  disk_min_gb=3000),
    "hgx-h200": ValidationProfile(gpu_count=8, gpu_model="H200", memory_min_gib=2500),
    "one-h100": ValidationProfile(gpu_count=1, gpu_model="H100"),
    "ib-ndr": ValidationProfile(ib_port_count=8, ib_rate_gbps=400),
}
H200_REASONS = [
    "gpu-model: saw 'NVIDIA H100 80GB HBM3' on 8 of 8 GPUs (PCI), expected a model "
    "containing 'H200'",
    "memory: saw 2048.0 GiB, expected at least 2500 GiB"]


class CollectorInspector:
    """The ramdisk's own collector on a sysfs tree (what the agent reports)."""

    def __init__(self, root: Path) -> None:
        self._root = root

    async def inspect(self, node: Node) -> dict[str, Any]:
        return await asyncio.to_thread(collect, self._root)


def conductor(store: Store, world: SimWorld, lifecycle: LifecycleSettings = AUTO,
              **port_overrides: Any) -> Conductor:
    validator = FactsValidator(store.nodes, ValidationSettings(profiles=PROFILES))
    ports = dataclasses.replace(fake_ports(world), validator=validator, **port_overrides)
    return Conductor(store.nodes, ports, lifecycle)


async def enroll(cond: Conductor, serial: str, profile: str) -> Node:
    return await cond.enroll(NewNode(state=S.ENROLLED, serial=serial, hostname=serial.lower(),
                                     profile=profile), actor="test")


async def history(store: Store, node_id: str) -> list[tuple[str, str, str, str]]:
    return [(h.event, h.from_state, h.to_state, h.reason)
            for h in await store.nodes.history(node_id)]


async def test_a_matching_node_is_deployed_on(store: Store, world: SimWorld) -> None:
    cond = conductor(store, world)
    node = await enroll(cond, "SKU-OK", "hgx-h100")
    done = await wait_for_state(store, node.id, S.ACTIVE)
    assert done.facts["sku"]["passed"] is True
    assert done.facts["sku"]["checks"] == ["gpus", "infiniband", "memory", "disks"]
    assert not [row for row in await history(store, node.id) if row[0] == HELD_EVENT]
    await cond.stop()


async def test_a_mismatch_is_held_in_inspected_until_overridden(store: Store,
                                                                world: SimWorld) -> None:
    cond = conductor(store, world)
    node = await enroll(cond, "SKU-H200", "hgx-h200")
    held = await wait_for_state(store, node.id, S.INSPECTED)
    await asyncio.sleep(0.3)  # the policy had its chance to deploy it
    held = await store.nodes.get(node.id)
    assert held.state is S.INSPECTED
    assert held.facts["sku"]["passed"] is False
    assert held.facts["sku"]["failures"] == H200_REASONS  # every reason at once
    rows = await history(store, node.id)
    assert [r[3] for r in rows if r[0] == HELD_EVENT] == [
        "does not match profile hgx-h200: " + "; ".join(H200_REASONS)]
    assert not [r for r in rows if r[2] == "deploying"]

    with pytest.raises(Conflict) as refused:  # an operator's deploy is refused too
        await cond.fire(node.id, E.DEPLOY, actor="alice")
    assert "does not match profile hgx-h200: gpu-model: saw 'NVIDIA H100 80GB HBM3'" in str(
        refused.value)
    assert "sku-override" in str(refused.value)

    await cond.override_sku(node.id, actor="alice", reason="H200s arrive next week; "
                                                          "run it as an H100 node")
    # the policy deploys it; the validation gate after the OS still sees the same hardware
    failed = await wait_for_state(store, node.id, S.VALIDATE_FAILED)
    rows = await history(store, node.id)
    override = [r for r in rows if r[0] == OVERRIDE_EVENT]
    assert override and override[0][3].startswith("H200s arrive next week")
    assert "overrides: gpu-model" in override[0][3]
    assert ("deploy", "inspected", "deploying") in [r[:3] for r in rows]
    assert failed.facts["sku_override"]["by"] == "alice"
    assert "gpu-model" in (failed.last_error or "")
    await cond.stop()


async def test_override_of_a_node_not_held_is_refused(store: Store, world: SimWorld) -> None:
    cond = conductor(store, world, LifecycleSettings(auto_inspect=True, auto_deploy=False))
    node = await enroll(cond, "SKU-FREE", "hgx-h100")
    await wait_for_state(store, node.id, S.INSPECTED)
    with pytest.raises(Conflict, match="is not held by the SKU gate"):
        await cond.override_sku(node.id, actor="alice", reason="why not")
    await cond.stop()


async def test_the_real_collector_on_an_h100_sysfs_tree(tmp_path: Path, store: Store,
                                                        world: SimWorld) -> None:
    """Inspection through the agent's collector: one 10de:2330 passes a one-H100 profile
    and is held against an 8x H200 one, before any OS or driver."""
    root = sysfs_tree(tmp_path, {"0000:17:00.0": ("0x10de", "0x2330", "0x030200")})
    cond = conductor(store, world, inspector=CollectorInspector(root))
    good = await enroll(cond, "SYSFS-1", "one-h100")
    bad = await enroll(cond, "SYSFS-8", "hgx-h200")
    assert (await wait_for_state(store, good.id, S.ACTIVE)).facts["gpus"][0]["name"] == (
        "NVIDIA H100 80GB HBM3")
    held = await wait_for_state(store, bad.id, S.INSPECTED)
    await asyncio.sleep(0.2)
    held = await store.nodes.get(bad.id)
    assert held.state is S.INSPECTED and held.facts["sku"]["failures"][:2] == [
        "gpu-count: saw 1 GPUs (PCI), expected 8",
        "gpu-model: saw 'NVIDIA H100 80GB HBM3' on 1 of 1 GPUs (PCI), expected a model "
        "containing 'H200'"]
    await cond.stop()


async def test_api_refuses_deploy_and_takes_an_override(aiohttp_client: Any, store: Store,
                                                        world: SimWorld) -> None:
    validator = FactsValidator(store.nodes, ValidationSettings(profiles=PROFILES))
    ports = dataclasses.replace(fake_ports(world), validator=validator)
    async with running_api(aiohttp_client, store, world, ports=ports) as api:  # manual
        node = await api.enroll(serial="API-SKU", profile="hgx-h200")
        path = f"/api/v1/nodes/{node['id']}"
        assert (await api.post(f"{path}/actions/inspect")).status == 202
        await wait_for_state(store, node["id"], S.INSPECTED)
        shown = (await api.get(path)).body
        assert "sku-override" in shown["allowed_actions"]
        assert "deploy" not in shown["allowed_actions"]
        assert shown["facts"]["sku"]["failures"] == H200_REASONS

        refused = await api.post(f"{path}/actions/deploy")
        assert refused.status == 409
        assert "does not match profile hgx-h200" in refused.body["detail"]
        assert "memory: saw 2048.0 GiB, expected at least 2500 GiB" in refused.body["detail"]

        no_reason = await api.post(f"{path}/actions/sku-override")
        assert no_reason.status == 422 and "needs a reason" in no_reason.body["detail"]
        viewer = await api.post(f"{path}/actions/sku-override", {"reason": "x"},
                                role=Role.VIEWER)
        assert viewer.status == 403

        ok = await api.post(f"{path}/actions/sku-override", {"reason": "ticket 4711"})
        assert ok.status == 202
        assert (await api.post(f"{path}/actions/deploy")).status == 202
        rows = await history(store, node["id"])
        assert [r[0] for r in rows if r[0] in (HELD_EVENT, OVERRIDE_EVENT, "deploy")] == [
            HELD_EVENT, OVERRIDE_EVENT, "deploy"]


IB_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "infiniband"
NOT_CHECKED = "InfiniBand not checked at inspection: no driver (no Mellanox HCA on PCI)"


async def test_a_ramdisk_without_an_infiniband_driver_is_noted_not_held(
        tmp_path: Path, store: Store, world: SimWorld) -> None:
    """The real collector on a node whose ramdisk loaded no InfiniBand driver: an 8-port
    profile does not hold it as "saw 0 ports"; the record and the history say the check did
    not run; it is deployed, and the validation gate (no OS report here: the same facts)
    fails it naming the missing driver, never a silent pass. A node whose ramdisk read 8 NDR
    ports and an Ethernet bond (a real ibstat, tests/fixtures/topology/infiniband/) passes
    with the check run."""
    bare = sysfs_tree(tmp_path / "bare", {})
    cond = conductor(store, world, inspector=CollectorInspector(bare))
    node = await enroll(cond, "IB-NONE", "ib-ndr")
    done = await wait_for_state(store, node.id, S.VALIDATE_FAILED)
    assert "ib-driver: no InfiniBand driver loaded (no Mellanox HCA on PCI)" in (
        done.last_error or "")
    assert done.facts["infiniband_driver"] == {"loaded": False, "modules": [],
                                               "mellanox_functions": 0}
    assert done.facts["sku"]["passed"] is True and done.facts["sku"]["failures"] == []
    assert done.facts["sku"]["checks"] == ["infiniband-not-checked"]
    assert done.facts["sku"]["notes"] == [NOT_CHECKED]
    rows = await history(store, node.id)
    assert [r[3] for r in rows if r[0] == NOTE_EVENT] == [NOT_CHECKED]
    await cond.stop()

    ndr = sysfs_tree(tmp_path / "ndr", {})
    load_modules(ndr)
    sysfs_from_ibstat(ndr, (IB_FIXTURES / "hpc-notes-ibstat.h100.cx7-ndr-bond.txt").read_text())
    cond = conductor(store, world, inspector=CollectorInspector(ndr))
    node = await enroll(cond, "IB-NDR", "ib-ndr")
    done = await wait_for_state(store, node.id, S.ACTIVE)
    assert done.facts["sku"]["checks"] == ["infiniband"] and done.facts["sku"]["notes"] == []
    assert not [r for r in await history(store, node.id) if r[0] == NOTE_EVENT]
    await cond.stop()
