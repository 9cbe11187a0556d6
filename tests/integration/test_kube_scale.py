"""1,000 kwok Nodes labelled by the daemon within the configured client-side rate limit, without
a single failed or retried request. The time goes in docs/performance.md ("## Kubernetes")."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.kube.model import LABEL_NODE_ID, LABEL_OPERANDS
from provisioner.lifecycle.validation import validation_passed
from tests.integration.kube_support import connected, domain_node, kube_settings
from tests.peers.kube import KubeCluster
from tests.peers.kube_admin import KubeAdmin, wait_until

pytestmark = pytest.mark.timeout(600)
NODES = 1000
QPS, BURST = 100.0, 20


async def test_thousand_nodes_labelled_within_the_rate_limit(kube_cluster: KubeCluster) -> None:
    admin = KubeAdmin(kube_cluster)
    names = [f"scale-{i:04d}" for i in range(NODES)]
    started = time.monotonic()
    await asyncio.to_thread(admin.create_nodes, names, labels={"scale": "1"})
    # Labelled once registered and Ready, as join() does; kwok's first status writes are
    # done, so the labels' resourceVersion guard (taints) meets no 409.
    await asyncio.to_thread(wait_until, lambda: admin.ready_count("scale=1") == NODES,
                            timeout_s=120, what="1000 kwok nodes Ready")
    created_s = time.monotonic() - started

    settings = kube_settings(kube_cluster, qps=QPS, burst=BURST, max_concurrency=8)
    async with connected(settings) as kube:
        joiner = KubeNodeJoiner(kube, settings, run_join=_never, validated=validation_passed)
        started = time.monotonic()
        await asyncio.gather(*(joiner.label(domain_node(n, serial=f"S{n}")) for n in names))
        elapsed = time.monotonic() - started
        stats = dataclasses.replace(kube.stats)  # a snapshot: the list below counts too
        labelled = await kube.list_nodes(label_selector=f"scale=1,{LABEL_NODE_ID}")

    print(f"\nkube scale: {NODES} nodes created and Ready in {created_s:.1f} s; labelled in "  # noqa: T201
          f"{elapsed:.1f} s: {stats.requests} requests, {stats.requests / elapsed:.1f}/s "
          f"(limit {QPS:g}/s, burst {BURST}), {stats.throttled} waited for the limiter, "
          f"retries {stats.retries}, failures {stats.failures}, conflicts {stats.conflicts}")
    assert stats.failures == 0 and stats.retries == 0 and stats.conflicts == 0
    assert stats.requests == 2 * NODES  # one read, one patch per node
    # The limiter held: no more than burst + qps·t requests in t seconds.
    assert stats.requests <= BURST + QPS * elapsed + 1
    assert len(labelled) == NODES
    assert all(n.labels[LABEL_OPERANDS] == "false" for n in labelled)
    await asyncio.to_thread(admin.delete_nodes, "scale=1")


async def _never(ticket: object, node: object) -> None:
    raise AssertionError("no join expected")
