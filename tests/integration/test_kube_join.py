"""Join against the real apiserver: the bootstrap token authenticates as kubeadm's would and is
gone afterwards; the kwok Node carries exactly the profile's labels, annotations and taints;
operands stay held until validation; readiness waits for GPU allocatable the test sets."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from provisioner.errors import FatalError
from provisioner.kube.join import NODE_GROUP, BootstrapTokens, JoinTicket, ca_cert_hashes
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.kube.model import ANNOTATION_MANAGED, LABEL_OPERANDS, KubeTimeout
from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.validation import validation_passed
from tests.integration.kube_support import (
    connected,
    create_kubelet_csr,
    domain_node,
    kube_settings,
    poll,
    self_review,
)
from tests.peers.kube import KubeCluster
from tests.peers.kube_admin import KubeAdmin, wait_until

pytestmark = pytest.mark.timeout(120)
PASSED = {"passed": True, "at": "2026-01-01T00:00:00+00:00", "failures": []}


@pytest.fixture
def admin(kube_cluster: KubeCluster) -> KubeAdmin:
    return KubeAdmin(kube_cluster)


class FakeKubeadm:
    """Stands in for the kubeadm join playbook: uses the token against the real apiserver the
    way a kubelet's TLS bootstrap does, then registers the Node (kwok plays the kubelet)."""

    def __init__(self, cluster: KubeCluster, admin: KubeAdmin, *, fail: bool = False) -> None:
        self.cluster, self.admin, self.fail = cluster, admin, fail
        self.tickets: list[JoinTicket] = []
        self.identity: tuple[str, list[str]] | None = None
        self.csr_user = ""

    async def __call__(self, ticket: JoinTicket, node: object) -> None:
        self.tickets.append(ticket)
        assert ticket.server == self.cluster.server
        assert ticket.ca_cert_hashes == ca_cert_hashes(self.cluster.ca_pem)
        self.identity = await poll(lambda: self_review(self.cluster, ticket.token),
                                   what="token authenticates")
        self.csr_user = await asyncio.to_thread(create_kubelet_csr, self.cluster, ticket.token,
                                                getattr(node, "hostname", ""))
        if self.fail:
            raise RuntimeError("kubeadm join failed")
        serial = getattr(node, "serial", "")
        await asyncio.to_thread(self.admin.create_node, getattr(node, "hostname", ""),
                                provider_id=f"provisioner://{serial}")


async def test_join_token_labels_and_gpu_readiness(kube_cluster: KubeCluster,
                                                   admin: KubeAdmin) -> None:
    settings = kube_settings(kube_cluster)
    kubeadm = FakeKubeadm(kube_cluster, admin)
    node = domain_node("gpu-join-1", serial="SER-J1")
    async with connected(settings) as kube:
        joiner = KubeNodeJoiner(kube, settings, kubeadm, validated=validation_passed)
        await joiner.join(node)

        # The token authenticated as kubeadm's default node token does, could file a CSR...
        (ticket,) = kubeadm.tickets
        assert "." in ticket.token and ticket.token not in repr(ticket)
        assert kubeadm.identity is not None
        user, groups = kubeadm.identity
        assert user == f"system:bootstrap:{ticket.token_id}"
        assert set(groups) == {"system:bootstrappers", NODE_GROUP, "system:authenticated"}
        assert kubeadm.csr_user == f"system:bootstrap:{ticket.token_id}"
        # ...and is gone: Secret deleted, and the apiserver stops accepting it once its
        # token-authentication cache (10 s success TTL) forgets it.
        names = await asyncio.to_thread(admin.secret_names, "kube-system")
        assert f"bootstrap-token-{ticket.token_id}" not in names
        await poll(lambda: True if self_review(kube_cluster, ticket.token) is None else None,
                   timeout_s=20, what="token rejected")

        # Exactly the profile's labels, annotations and taints; operands held.
        k8s_node = await asyncio.to_thread(admin.node, "gpu-join-1")
        assert k8s_node.metadata.labels == {
            "kubernetes.io/hostname": "gpu-join-1", "type": "kwok",  # the kubelet's own
            "provisioner.io/node-id": "id-gpu-join-1", "provisioner.io/profile": "gpu-worker",
            "provisioner.io/rack": "r01", "provisioner.io/position": "u12",
            "node-role.kubernetes.io/gpu": "", "example.com/pool": "train",
            "nvidia.com/gpu.deploy.driver": "false", LABEL_OPERANDS: "false",
        }
        annotations = dict(k8s_node.metadata.annotations)
        managed = json.loads(annotations.pop(ANNOTATION_MANAGED))
        assert annotations == {"kwok.x-k8s.io/node": "fake", "example.com/owner": "ml-platform",
                               "provisioner.io/serial": "SER-J1",
                               "provisioner.io/macs": "52:54:00:00:00:01"}
        assert managed["taints"] == ["nvidia.com/gpu:NoSchedule"]
        assert {(t.key, t.value, t.effect) for t in k8s_node.spec.taints} == {
            ("kwok.x-k8s.io/node", "fake", "NoSchedule"),
            ("nvidia.com/gpu", "present", "NoSchedule")}
        assert not any(k.startswith("feature.node.kubernetes.io/") for k in
                       k8s_node.metadata.labels)

        # Validation passed: operands released, then wait for the GPU stack the test fakes.
        release = asyncio.create_task(joiner.release_operands(node))
        await asyncio.sleep(1.0)
        assert not release.done()
        labels = (await asyncio.to_thread(admin.node, "gpu-join-1")).metadata.labels
        assert LABEL_OPERANDS not in labels
        await asyncio.to_thread(admin.patch_node, "gpu-join-1",
                                {"status": {"allocatable": {"nvidia.com/gpu": "8"},
                                            "capacity": {"nvidia.com/gpu": "8"}}}, status=True)
        await asyncio.sleep(0.5)
        assert not release.done()  # allocatable alone is not enough: gpu.count is missing
        await asyncio.to_thread(admin.patch_node, "gpu-join-1",
                                {"metadata": {"labels": {"nvidia.com/gpu.count": "8"}}})
        await asyncio.wait_for(release, 10)

        # Idempotent: joining a node that passed validation again finds the labelled Node;
        # no token, no playbook, no patch (its operands stay released), no GPU-stack wait.
        before = kube.stats.requests
        await joiner.join(dataclasses.replace(node, state=NodeState.ACTIVE,
                                              facts={"validation": PASSED}))
        assert len(kubeadm.tickets) == 1
        assert kube.stats.requests - before <= 3  # find, (no patch), ready
        labels = (await asyncio.to_thread(admin.node, "gpu-join-1")).metadata.labels
        assert LABEL_OPERANDS not in labels
        assert kube.stats.failures == 0


async def test_token_is_deleted_when_the_join_fails(kube_cluster: KubeCluster,
                                                    admin: KubeAdmin) -> None:
    settings = kube_settings(kube_cluster)
    kubeadm = FakeKubeadm(kube_cluster, admin, fail=True)
    node = domain_node("gpu-join-fail")
    async with connected(settings) as kube:
        # A token an earlier, crashed run left behind goes before a new one is made.
        stale = await BootstrapTokens(kube, ttl_s=600).create(node)
        with pytest.raises(RuntimeError, match="kubeadm join failed"):
            await KubeNodeJoiner(kube, settings, kubeadm, validated=validation_passed).join(node)
    (ticket,) = kubeadm.tickets
    names = await asyncio.to_thread(admin.secret_names, "kube-system")
    assert f"bootstrap-token-{ticket.token_id}" not in names
    assert f"bootstrap-token-{stale.token_id}" not in names
    assert not any(name.startswith("bootstrap-token-") for name in names)


async def test_timeout_names_the_missing_gpu_condition(kube_cluster: KubeCluster,
                                                       admin: KubeAdmin) -> None:
    settings = kube_settings(kube_cluster, gpu_ready_timeout_s=1.0)
    await asyncio.to_thread(admin.create_node, "nvl-join-1")
    node = domain_node("nvl-join-1", profile="nvl72")
    async with connected(settings) as kube:
        joiner = KubeNodeJoiner(kube, settings, FakeKubeadm(kube_cluster, admin),
                                validated=validation_passed)
        await joiner.join(node)  # joining never waits for the GPU stack: not validated yet
        labels = (await asyncio.to_thread(admin.node, "nvl-join-1")).metadata.labels
        assert labels[LABEL_OPERANDS] == "false"
        with pytest.raises(KubeTimeout) as info:
            await joiner.release_operands(node)  # the Slurm hand-off, after validation
    message = str(info.value)
    assert "not GPU-ready after 1 s" in message
    assert 'status.allocatable["nvidia.com/gpu"] > 0' in message
    assert "label nvidia.com/gpu.count" in message and "label nvidia.com/gpu.clique" in message
    labels = (await asyncio.to_thread(admin.node, "nvl-join-1")).metadata.labels
    assert LABEL_OPERANDS not in labels  # released: nothing held


async def test_same_hostname_other_machine_is_refused(kube_cluster: KubeCluster,
                                                      admin: KubeAdmin) -> None:
    await asyncio.to_thread(admin.create_node, "imposter-1", provider_id="provisioner://OTHER")
    await asyncio.to_thread(wait_until, lambda: admin.node_ready("imposter-1"))
    settings = kube_settings(kube_cluster)
    async with connected(settings) as kube:
        joiner = KubeNodeJoiner(kube, settings, FakeKubeadm(kube_cluster, admin),
                                validated=validation_passed)
        with pytest.raises(FatalError, match="belongs to another machine"):
            await joiner.join(domain_node("imposter-1", serial="SER-MINE"))
