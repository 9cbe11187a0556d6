"""Objects for the test cluster: what ``kubeadm init`` creates (cluster-info, bootstrap-token
RBAC) and manifests tests create (kwok Nodes, pods bound to them, PDBs, DaemonSets)."""

from __future__ import annotations

import base64
import json
from typing import Any

from kubernetes import client

BOOTSTRAP_GROUP = "system:bootstrappers:kubeadm:default-node-token"


def cluster_info_kubeconfig(server: str, ca_pem: bytes) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "preferences": {}, "users": None,
        "contexts": None, "current-context": "",
        "clusters": [{"name": "", "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
    })


def _binding(kind: str, name: str, role_kind: str, role: str, subjects: list[dict[str, str]],
             namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, str] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                        "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", **s} for s in subjects]}


def install_kubeadm_objects(api: Any, server: str, ca_pem: bytes) -> None:
    """cluster-info (kubeadm's bootstrap-token phase) and the RBAC kubeadm grants tokens."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_config_map("kube-public", {
        "metadata": {"name": "cluster-info", "namespace": "kube-public"},
        "data": {"kubeconfig": cluster_info_kubeconfig(server, ca_pem)}})
    group = {"kind": "Group", "name": BOOTSTRAP_GROUP}
    rbac.create_namespaced_role("kube-public", {
        "metadata": {"name": "kubeadm:bootstrap-signer-clusterinfo",
                     "namespace": "kube-public"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "resourceNames": ["cluster-info"], "verbs": ["get"]}]})
    rbac.create_namespaced_role_binding("kube-public", _binding(
        "RoleBinding", "kubeadm:bootstrap-signer-clusterinfo", "Role",
        "kubeadm:bootstrap-signer-clusterinfo",
        [{"kind": "User", "name": "system:anonymous"}, group], "kube-public"))
    rbac.create_cluster_role_binding(_binding(
        "ClusterRoleBinding", "kubeadm:kubelet-bootstrap", "ClusterRole",
        "system:node-bootstrapper", [group]))
    rbac.create_cluster_role_binding(_binding(
        "ClusterRoleBinding", "kubeadm:node-autoapprove-bootstrap", "ClusterRole",
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient", [group]))
    rbac.create_cluster_role({
        "metadata": {"name": "kubeadm:get-nodes"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]})
    rbac.create_cluster_role_binding(_binding(
        "ClusterRoleBinding", "kubeadm:get-nodes", "ClusterRole", "kubeadm:get-nodes",
        [group]))


# Manifests ----------------------------------------------------------------------------------

def kwok_node(name: str, *, labels: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None,
              provider_id: str | None = None, kwok: bool = True) -> dict[str, Any]:
    """A Node as a kubelet would register it; kwok manages it (Ready, heartbeats) if ``kwok``."""
    annots = dict(annotations or {})
    spec: dict[str, Any] = {}
    if kwok:
        annots["kwok.x-k8s.io/node"] = "fake"
        spec["taints"] = [{"key": "kwok.x-k8s.io/node", "value": "fake",
                           "effect": "NoSchedule"}]
    if provider_id:
        spec["providerID"] = provider_id
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": annots,
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok",
                                    **(labels or {})}},
            "spec": spec}


def bound_pod(name: str, node: str, *, labels: dict[str, str] | None = None,
              owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod already bound to ``node`` (no scheduler here), tolerating kwok's taint."""
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 0,
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "c", "image": "registry.invalid/none:1"}]}}


def daemonset(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c",
                                                           "image": "registry.invalid/ds:1"}]}}}}


def pdb(name: str, app: str, min_available: int) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}}}


def pdb_status(generation: int, healthy: int, desired: int, expected: int) -> dict[str, Any]:
    """What the disruption controller (absent here) would write to a PDB's status."""
    return {"status": {"observedGeneration": generation, "currentHealthy": healthy,
                       "desiredHealthy": desired, "expectedPods": expected,
                       "disruptionsAllowed": max(healthy - desired, 0)}}
