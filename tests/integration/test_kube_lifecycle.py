"""The conductor's maintenance flag and the real apiserver, both ways: maintenance-on cordons
and drains an active node, maintenance-off uncordons it; a cordon made by someone else in
Kubernetes becomes the maintenance flag (with Kubernetes' reason) without a drain."""

from __future__ import annotations

import asyncio

import pytest

from provisioner.config import LifecycleSettings
from provisioner.daemon.hooks import maintenance_from
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.kube.model import LABEL_NODE_ID
from provisioner.kube.sync import KubeSync
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.validation import validation_passed
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports
from tests.integration.kube_support import connected, kube_settings, poll
from tests.peers.kube import KubeCluster
from tests.peers.kube_admin import KubeAdmin

pytestmark = pytest.mark.timeout(90)


async def _never_join(ticket: object, node: object) -> None:
    raise AssertionError("no join in this test")


async def test_maintenance_both_ways(kube_cluster: KubeCluster, store: Store, world: SimWorld,
                                     make_node) -> None:  # type: ignore[no-untyped-def]
    admin = KubeAdmin(kube_cluster)
    async with connected(kube_settings(kube_cluster)) as kube:
        joiner = KubeNodeJoiner(kube, kube_settings(kube_cluster), run_join=_never_join,
                                validated=validation_passed)
        base = fake_ports(world)
        ports = Ports(bmc=base.bmc, inspector=base.inspector, installer=base.installer,
                      kube=joiner, slurm=base.slurm)
        conductor = Conductor(store.nodes, ports, LifecycleSettings(auto_inspect=False))
        node = await make_node(NodeState.ACTIVE, hostname="maint-a")
        other = await make_node(NodeState.ACTIVE, hostname="maint-b")
        await asyncio.to_thread(admin.create_node, "maint-a", labels={LABEL_NODE_ID: node.id})
        await asyncio.to_thread(admin.create_node, "maint-b", labels={LABEL_NODE_ID: other.id})

        await conductor.set_maintenance(node.id, True, actor="op", reason="swap PSU")
        await poll(lambda: admin.node("maint-a").spec.unschedulable, what="cordon")
        await conductor.set_maintenance(node.id, False, actor="op", reason="")
        await poll(lambda: not admin.node("maint-a").spec.unschedulable, what="uncordon")

        sync = KubeSync(kube, maintenance_from("kubernetes", store, conductor), grace_s=300,
                        interval_s=0.5)
        await sync.sync_once()  # what is there now is the baseline
        await asyncio.to_thread(admin.patch_node, "maint-b", {"spec": {"unschedulable": True}})
        await sync.sync_once()
        flagged = await store.nodes.get(other.id)
        assert flagged.maintenance and flagged.maintenance_reason
        last = (await store.nodes.history(other.id))[-1]
        assert (last.event, last.actor) == ("maintenance_on", "kubernetes")
        events = [h.event for h in await store.nodes.history(node.id)]
        assert events == ["enroll", "maintenance_on", "maintenance_off"]
        await conductor.stop()
