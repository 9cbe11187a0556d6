"""Daemon-side helpers for the Kubernetes integration tests: settings, a connected client,
domain Nodes, and the bootstrap-token checks a kubelet's TLS bootstrap would make."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from provisioner.config import KubeProfile, KubeSettings
from provisioner.domain import Node
from provisioner.ids import NodeId
from provisioner.kube.client import KubeClient
from provisioner.lifecycle.states import NodeState
from tests.peers.kube import KubeCluster


def kube_settings(cluster: KubeCluster, **overrides: Any) -> KubeSettings:
    values: dict[str, Any] = {
        "kubeconfig": cluster.kubeconfig, "qps": 100.0, "burst": 50, "poll_interval_s": 0.1,
        "join_timeout_s": 20.0, "ready_timeout_s": 20.0, "gpu_ready_timeout_s": 20.0,
        "drain_timeout_s": 20.0, "eviction_backoff_s": 0.2, "retry_backoff_s": 0.1,
        "profiles": {
            "gpu-worker": KubeProfile(
                labels={"node-role.kubernetes.io/gpu": "", "example.com/pool": "train"},
                annotations={"example.com/owner": "ml-platform"},
                taints=["nvidia.com/gpu=present:NoSchedule"], host_driver=True),
            "nvl72": KubeProfile(nvlink_multinode=True),
        },
    }
    values.update(overrides)
    return KubeSettings(**values)


@asynccontextmanager
async def connected(settings: KubeSettings) -> AsyncIterator[KubeClient]:
    kube = await KubeClient.connect(settings)
    try:
        yield kube
    finally:
        await kube.aclose()


def domain_node(hostname: str, *, serial: str = "SER-1", profile: str | None = "gpu-worker",
                rack: str | None = "r01", position: str | None = "u12",
                macs: tuple[str, ...] = ("52:54:00:00:00:01",),
                facts: dict[str, Any] | None = None) -> Node:
    now = datetime.now(UTC)
    return Node(id=NodeId(f"id-{hostname}"), state=NodeState.JOINING, hostname=hostname,
                serial=serial, macs=macs, maintenance=False, maintenance_reason="",
                profile=profile, rack=rack, position=position, facts=facts or {},
                last_error="", checkpoint=(), version=1, history_seq=0, bmc=None,
                created_at=now, updated_at=now)


def self_review(cluster: KubeCluster, token: str) -> tuple[str, list[str]] | None:
    """Who the apiserver says ``token`` is (SelfSubjectReview); None on 401."""
    api = cluster.api_client(token=token)
    try:
        review = client.AuthenticationV1Api(api).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    except ApiException as exc:
        if exc.status == 401:
            return None
        raise
    finally:
        api.close()
    info = review.status.user_info
    return info.username, list(info.groups or [])


def create_kubelet_csr(cluster: KubeCluster, token: str, node_name: str) -> str:
    """What the kubelet's TLS bootstrap does with the token: POST a client-cert CSR."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder().subject_name(x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
        x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}")]))
        .sign(key, hashes.SHA256()))
    pem = csr.public_bytes(serialization.Encoding.PEM)
    api = cluster.api_client(token=token)
    try:
        made = client.CertificatesV1Api(api).create_certificate_signing_request({
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"generateName": "node-csr-"},
            "spec": {"request": base64.b64encode(pem).decode(),
                     "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                     "usages": ["digital signature", "client auth"]}})
    finally:
        api.close()
    return str(made.spec.username)


async def poll(check: Any, *, timeout_s: float = 10.0, what: str = "condition") -> Any:
    """Await ``asyncio.to_thread(check)`` until it returns something other than None."""
    async with asyncio.timeout(timeout_s):
        while True:
            value = await asyncio.to_thread(check)
            if value is not None:
                return value
            await asyncio.sleep(0.1)
