"""The test cluster itself (PEERS.md §10): it starts, a kwok Node becomes Ready, a Pod runs,
and kubeadm's objects (cluster-info, bootstrap RBAC) are there."""

from __future__ import annotations

import json
import ssl
import urllib.request

from tests.peers.kube import KubeCluster
from tests.peers.kube_admin import KubeAdmin, wait_until


def test_kwok_node_becomes_ready_and_runs_a_pod(kube_cluster: KubeCluster) -> None:
    admin = KubeAdmin(kube_cluster)
    try:
        admin.create_node("peer-node-1")
        wait_until(lambda: admin.node_ready("peer-node-1"), what="kwok Node Ready")
        admin.create_pod("default", "peer-pod-1", "peer-node-1")
        wait_until(lambda: admin.pod_phase("default", "peer-pod-1") == "Running",
                   what="Pod Running")
        pod = admin.pod("default", "peer-pod-1")
        assert pod is not None and pod.status.pod_ip
        admin.core.delete_namespaced_pod("peer-pod-1", "default")
        wait_until(lambda: admin.pod("default", "peer-pod-1") is None, what="Pod deleted")
        admin.core.delete_node("peer-node-1")
    finally:
        admin.close()


def test_cluster_info_is_public_and_names_the_server(kube_cluster: KubeCluster) -> None:
    # kubeadm join reads it anonymously before it trusts anything (token discovery).
    ctx = ssl.create_default_context(cafile=str(kube_cluster.pki.ca_crt))
    url = f"{kube_cluster.server}/api/v1/namespaces/kube-public/configmaps/cluster-info"
    with urllib.request.urlopen(url, context=ctx, timeout=10) as resp:  # noqa: S310
        body = json.load(resp)
    assert json.loads(body["data"]["kubeconfig"])["clusters"][0]["cluster"]["server"] == (
        kube_cluster.server)
