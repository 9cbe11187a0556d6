"""Drain against the real Eviction API: a PDB with minAvailable refuses (429) until the test
relaxes it; DaemonSet pods stay; a budget still refusing at the deadline is named."""

from __future__ import annotations

import asyncio
import logging
from functools import partial

import pytest

from provisioner.kube.drain import DrainTimeout
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.kube.model import ANNOTATION_CORDON, EvictionBlocked
from provisioner.lifecycle.validation import validation_passed
from tests.integration.kube_support import connected, domain_node, kube_settings
from tests.peers.kube import KubeCluster
from tests.peers.kube_admin import KubeAdmin, wait_until
from tests.peers.kube_objects import daemonset

pytestmark = pytest.mark.timeout(120)


def _workload(admin: KubeAdmin, namespace: str, node: str) -> None:
    """A kwok node running: 2 pods behind a PDB (minAvailable 2), 1 free pod, 1 DaemonSet pod."""
    admin.create_namespace(namespace)
    admin.create_node(node)
    wait_until(lambda: admin.node_ready(node), what="node Ready")
    ds = admin.create_daemonset(namespace, daemonset("agent"))
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
             "uid": ds.metadata.uid, "controller": True}
    admin.create_pod(namespace, "agent-x", node, labels={"app": "agent"}, owner=owner)
    for name in ("web-1", "web-2"):
        admin.create_pod(namespace, name, node, labels={"app": "web"})
    admin.create_pod(namespace, "loose", node, labels={"app": "loose"})
    for name in ("agent-x", "web-1", "web-2", "loose"):
        wait_until(partial(_running, admin, namespace, name), what=f"{name} Running")
    admin.create_pdb(namespace, "web-pdb", "web", min_available=2, healthy=2)


async def test_pdb_blocks_until_relaxed_and_daemonset_pods_stay(
        kube_cluster: KubeCluster, caplog: pytest.LogCaptureFixture) -> None:
    admin = KubeAdmin(kube_cluster)
    ns, name = "drain-a", "drain-node-a"
    await asyncio.to_thread(_workload, admin, ns, name)
    settings = kube_settings(kube_cluster, eviction_backoff_s=0.2)
    node = domain_node(name)
    async with connected(settings) as kube:
        with pytest.raises(EvictionBlocked) as blocked:  # the raw 429, as the API says it
            await kube.evict_pod(ns, "web-1")
        assert blocked.value.pdb == "web-pdb"

        joiner = KubeNodeJoiner(kube, settings, run_join=_never, validated=validation_passed)
        caplog.set_level(logging.WARNING, logger="provisioner.kube.drain")
        drain = asyncio.create_task(joiner.maintenance(node, True, "maintenance: test"))
        await asyncio.to_thread(wait_until, lambda: admin.pod(ns, "loose") is None,
                                what="free pod evicted")
        await asyncio.sleep(1.0)
        assert not drain.done()
        assert "PodDisruptionBudget drain-a/web-pdb" in caplog.text
        assert await asyncio.to_thread(admin.pod_phase, ns, "web-1") == "Running"

        await asyncio.to_thread(admin.relax_pdb, ns, "web-pdb", min_available=0, healthy=2)
        await asyncio.wait_for(drain, 15)

        assert await asyncio.to_thread(admin.pod, ns, "web-1") is None
        assert await asyncio.to_thread(admin.pod, ns, "web-2") is None
        assert await asyncio.to_thread(admin.pod_phase, ns, "agent-x") == "Running"
        k8s_node = await asyncio.to_thread(admin.node, name)
        assert k8s_node.spec.unschedulable is True
        assert k8s_node.metadata.annotations[ANNOTATION_CORDON] == "maintenance: test"

        await joiner.maintenance(node, False)
        k8s_node = await asyncio.to_thread(admin.node, name)
        assert not k8s_node.spec.unschedulable
        assert ANNOTATION_CORDON not in k8s_node.metadata.annotations

        await joiner.remove(node)  # retire: drain (nothing left) and delete the Node
        assert await kube.find_node(name) is None
        await joiner.remove(node)  # gone already: success
        assert kube.stats.failures == 0


async def test_drain_deadline_names_the_blocking_pdb(kube_cluster: KubeCluster) -> None:
    admin = KubeAdmin(kube_cluster)
    ns, name = "drain-b", "drain-node-b"
    await asyncio.to_thread(_workload, admin, ns, name)
    settings = kube_settings(kube_cluster, drain_timeout_s=1.5, eviction_backoff_s=0.2)
    async with connected(settings) as kube:
        joiner = KubeNodeJoiner(kube, settings, run_join=_never, validated=validation_passed)
        with pytest.raises(DrainTimeout) as info:
            await joiner.maintenance(domain_node(name), True)
    message = str(info.value)
    assert "PodDisruptionBudget drain-b/web-pdb still refuses eviction of" in message
    assert "drain-b/web-1" in message and "drain-b/web-2" in message
    assert "agent-x" not in message


def _running(admin: KubeAdmin, namespace: str, name: str) -> bool:
    return admin.pod_phase(namespace, name) == "Running"


async def _never(ticket: object, node: object) -> None:
    raise AssertionError("no join expected")
