"""Kubernetes → daemon against the real apiserver: a node cordoned by someone else, or NotReady
past the grace period, is reported once; our own cordon and a short NotReady are not."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from provisioner.kube.drain import cordon
from provisioner.kube.model import LABEL_NODE_ID
from provisioner.kube.sync import SLINKY_CORDON_REASON, KubeSync
from tests.integration.kube_support import connected, kube_settings
from tests.peers.kube import KubeCluster
from tests.peers.kube_admin import KubeAdmin

pytestmark = pytest.mark.timeout(60)


def _ready(status: str, since: datetime) -> dict[str, object]:
    stamp = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": "KubeletReady" if status == "True"
        else "KubeletNotReady", "message": "", "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp}]}}


async def test_sync_reports_foreign_cordon_and_long_not_ready(kube_cluster: KubeCluster) -> None:
    admin = KubeAdmin(kube_cluster)
    now = datetime.now(UTC)
    names = ["sync-a", "sync-b", "sync-c", "sync-d"]

    def setup() -> None:
        for name in names:  # plain Nodes (no kwok): the test owns their status
            admin.create_node(name, labels={LABEL_NODE_ID: f"id-{name}"}, kwok=False)
            admin.patch_node(name, _ready("True", now - timedelta(hours=1)), status=True)

    await asyncio.to_thread(setup)
    reports: list[tuple[str, bool, str]] = []

    async def on_change(hostname: str, maintenance: bool, reason: str) -> None:
        if hostname in names:
            reports.append((hostname, maintenance, reason))

    async with connected(kube_settings(kube_cluster)) as kube:
        sync = KubeSync(kube, on_change, grace_s=300, interval_s=1)
        await sync.sync_once()
        assert reports == []

        await asyncio.to_thread(admin.patch_node, "sync-a", {
            "spec": {"unschedulable": True},
            "metadata": {"annotations": {SLINKY_CORDON_REASON: "slurm-operator: bad GPU"}}})
        await asyncio.to_thread(admin.patch_node, "sync-b",
                                _ready("False", now - timedelta(minutes=10)), status=True)
        await asyncio.to_thread(admin.patch_node, "sync-c",
                                _ready("False", now - timedelta(seconds=10)), status=True)
        await cordon(kube, "sync-d", "maintenance: ours")
        await sync.sync_once()
        await sync.sync_once()  # edge-triggered: nothing new the second time
        by_host = {host: (maintenance, reason) for host, maintenance, reason in reports}
        assert len(reports) == 2, reports
        assert by_host["sync-a"] == (True, "cordoned in Kubernetes: slurm-operator: bad GPU")
        maintenance, reason = by_host["sync-b"]
        assert maintenance and reason.startswith("Ready=False for ")
        assert reason.endswith("KubeletNotReady")

        reports.clear()
        await asyncio.to_thread(admin.patch_node, "sync-a", {"spec": {"unschedulable": None}})
        await asyncio.to_thread(admin.patch_node, "sync-b", _ready("True", now), status=True)
        await sync.sync_once()
        assert sorted(h for h, m, _ in reports if not m) == ["sync-a", "sync-b"]
        assert all("recovered in Kubernetes" in r for _, _, r in reports)
    selector = f"{LABEL_NODE_ID} in ({','.join(f'id-{n}' for n in names)})"
    await asyncio.to_thread(admin.delete_nodes, selector)
