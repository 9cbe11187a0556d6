"""Blocking admin helpers for tests (the test's own hands on the cluster, not the daemon's).

Call them from async tests through ``asyncio.to_thread`` (the loop guard fails blocking calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.peers.kube import KubeCluster
from tests.peers.kube_objects import bound_pod, kwok_node, pdb, pdb_status

T = TypeVar("T")


class KubeAdmin:
    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster
        self.api = cluster.api_client()
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.policy = client.PolicyV1Api(self.api)

    def close(self) -> None:
        self.api.close()

    # Nodes
    def create_node(self, name: str, **kwargs: Any) -> None:
        self.core.create_node(kwok_node(name, **kwargs))

    def create_nodes(self, names: list[str], *, threads: int = 8, **kwargs: Any) -> None:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda n: self.create_node(n, **kwargs), names))

    def node(self, name: str) -> Any:
        return self.core.read_node(name)

    def patch_node(self, name: str, body: Any, *, status: bool = False) -> None:
        if status:
            self.core.patch_node_status(name, body)
        else:
            self.core.patch_node(name, body)

    def delete_nodes(self, label_selector: str) -> None:
        self.core.delete_collection_node(label_selector=label_selector)

    def ready_count(self, label_selector: str) -> int:
        nodes = self.core.list_node(label_selector=label_selector).items
        return sum(any(c.type == "Ready" and c.status == "True"
                       for c in n.status.conditions or []) for n in nodes)

    def node_ready(self, name: str) -> bool:
        conds = self.node(name).status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conds)

    # Namespaced workloads
    def create_namespace(self, name: str) -> None:
        self.core.create_namespace({"metadata": {"name": name}})

    def create_pod(self, namespace: str, name: str, node: str, **kwargs: Any) -> None:
        self.core.create_namespaced_pod(namespace, bound_pod(name, node, **kwargs))

    def pod(self, namespace: str, name: str) -> Any | None:
        try:
            return self.core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pod_phase(self, namespace: str, name: str) -> str | None:
        pod = self.pod(namespace, name)
        return None if pod is None else pod.status.phase

    def create_pdb(self, namespace: str, name: str, app: str, min_available: int,
                   healthy: int) -> None:
        """Create a PDB and write the status the disruption controller would."""
        made = self.policy.create_namespaced_pod_disruption_budget(
            namespace, pdb(name, app, min_available))
        self.policy.patch_namespaced_pod_disruption_budget_status(
            name, namespace,
            pdb_status(made.metadata.generation, healthy, min_available, healthy))

    def relax_pdb(self, namespace: str, name: str, min_available: int, healthy: int) -> None:
        made = self.policy.patch_namespaced_pod_disruption_budget(
            name, namespace, {"spec": {"minAvailable": min_available}})
        self.policy.patch_namespaced_pod_disruption_budget_status(
            name, namespace,
            pdb_status(made.metadata.generation, healthy, min_available, healthy))

    def create_daemonset(self, namespace: str, body: dict[str, Any]) -> Any:
        return self.apps.create_namespaced_daemon_set(namespace, body)

    def secret_names(self, namespace: str) -> set[str]:
        return {s.metadata.name for s in self.core.list_namespaced_secret(namespace).items}


def wait_until(check: Callable[[], T | None], *, timeout_s: float = 30.0,
               what: str = "condition") -> T:
    """Poll a blocking ``check`` until it returns a truthy value (use from a thread)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met after {timeout_s} s")
        time.sleep(0.1)
