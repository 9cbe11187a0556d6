"""Kubernetes → daemon against the real apiserver: a node cordoned by someone else, or NotReady
past the grace period, is reported once; our own cordon and a short NotReady are not."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from provisioner.health.records import Report
from provisioner.kube.client import KubeClient
from provisioner.kube.drain import cordon
from provisioner.kube.model import LABEL_NODE_ID, NodeWatch
from provisioner.kube.sync import SLINKY_CORDON_REASON, KubeSync
from provisioner.kube.wire import node_watch
from tests.integration.kube_support import connected, kube_settings
from tests.peers.kube import KubeCluster
from tests.peers.kube_admin import KubeAdmin

pytestmark = pytest.mark.timeout(60)
# the apiserver's event for a watch from a compacted version (its Status, as sent)
EXPIRED = (b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},'
           b'"status":"Failure","message":"too old resource version: 1 (235)",'
           b'"reason":"Expired","code":410}}')


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


async def test_the_sync_follows_a_watch_after_one_list(kube_cluster: KubeCluster) -> None:
    """At rest the sync does not list the fleet every pass: one list, then a watch per pass
    that carries only the Nodes that changed. A cordon seen through the watch is reported, a
    heartbeat alone is not, a deleted Node leaves the findings, and stopping the daemon in
    the middle of a watch does not wait for the watch to end."""
    admin = KubeAdmin(kube_cluster)
    now = datetime.now(UTC)
    names = ["watch-a", "watch-b", "watch-c"]

    def setup() -> None:
        for name in names:
            admin.create_node(name, labels={LABEL_NODE_ID: f"id-{name}"}, kwok=False)
            admin.patch_node(name, _ready("True", now - timedelta(hours=1)), status=True)

    await asyncio.to_thread(setup)
    changes: list[tuple[str, bool, str]] = []
    passes: list[dict[str, list[Report]]] = []

    async def on_change(hostname: str, maintenance: bool, reason: str) -> None:
        if hostname in names:
            changes.append((hostname, maintenance, reason))

    async def on_findings(by_hostname: dict[str, list[Report]]) -> None:
        passes.append(by_hostname)

    async def until(check: Callable[[], bool]) -> None:
        for _ in range(200):
            if check():
                return
            await asyncio.sleep(0.05)
        raise AssertionError("not seen within 10 s")

    pool = ThreadPoolExecutor(4, "kube-test")
    settings = kube_settings(kube_cluster)
    async with connected(settings) as kube:
        kube = KubeClient(kube._api, settings, executor=pool)  # a pool the test can join
        sync = KubeSync(kube, on_change, grace_s=300, interval_s=1, on_findings=on_findings)
        task = asyncio.create_task(sync.run())
        await until(lambda: len(passes) >= 2)
        assert set(names) <= set(passes[-1])

        await asyncio.to_thread(admin.patch_node, "watch-a", {"spec": {"unschedulable": True}})
        await until(lambda: bool(changes))
        assert changes == [("watch-a", True, "cordoned in Kubernetes")]
        beat = _ready("True", now - timedelta(hours=1))
        beat["status"]["conditions"][0]["lastHeartbeatTime"] = (  # type: ignore[index]
            datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        await asyncio.to_thread(admin.patch_node, "watch-b", beat, status=True)
        await asyncio.to_thread(admin.delete_nodes, f"{LABEL_NODE_ID}=id-watch-c")
        seen = len(passes)
        await until(lambda: len(passes) >= seen + 2 and "watch-c" not in passes[-1])
        assert changes == [("watch-a", True, "cordoned in Kubernetes")]
        assert sync.lists == 1  # every change came through the watch
        assert kube.stats.requests >= 3  # the list and at least two watches

        await asyncio.sleep(0.3)  # a watch is in flight: the daemon stops
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        started = time.monotonic()
        await asyncio.to_thread(pool.shutdown, wait=True)
        assert time.monotonic() - started < 0.9  # the watch's read was cut, not waited out
    await asyncio.to_thread(admin.delete_nodes,
                            f"{LABEL_NODE_ID} in ({','.join(f'id-{n}' for n in names)})")


async def test_a_watch_that_expires_lists_again(kube_cluster: KubeCluster) -> None:
    """410 Gone (the version watched from was compacted away) makes the sync list again.
    The apiserver here keeps every version in its watch cache, so the one expiry is the
    apiserver's own ERROR event (tests/unit/test_kube_watch.py) handed to the sync once."""
    admin = KubeAdmin(kube_cluster)
    await asyncio.to_thread(admin.create_node, "expire-a",
                            labels={LABEL_NODE_ID: "id-expire-a"}, kwok=False)
    passes: list[set[str]] = []

    class ExpiresOnce(KubeClient):
        expired = False

        async def watch_nodes(self, label_selector: str | None, resource_version: str, *,
                              timeout_s: int) -> NodeWatch:
            if not self.expired:
                self.expired = True
                return node_watch([EXPIRED], resource_version)
            return await super().watch_nodes(label_selector, resource_version,
                                             timeout_s=timeout_s)

    async def on_change(hostname: str, maintenance: bool, reason: str) -> None:
        pass

    async def on_findings(by_hostname: dict[str, list[Report]]) -> None:
        passes.append(set(by_hostname))

    settings = kube_settings(kube_cluster)
    async with connected(settings) as connected_kube:
        kube = ExpiresOnce(connected_kube._api, settings)
        sync = KubeSync(kube, on_change, grace_s=300, interval_s=0.2, on_findings=on_findings)
        task = asyncio.create_task(sync.run())
        for _ in range(100):
            if sync.lists >= 2 and len(passes) >= 4:
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await kube.aclose()
    assert sync.lists == 2
    assert all("expire-a" in seen for seen in passes)
    await asyncio.to_thread(admin.delete_nodes, f"{LABEL_NODE_ID}=id-expire-a")
