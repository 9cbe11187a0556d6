"""Integration fixtures shared by several modules: one real Kubernetes control plane per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.peers.kube import KubeCluster, kube_unavailable_reason, running_kube


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    """etcd + kube-apiserver + kwok (PEERS.md §10), shared: tests use unique names."""
    if (reason := kube_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_kube() as cluster:
        yield cluster
