"""The Slinky hand-off on a real kube-apiserver (kwok Node) and a real Slurm 22.05.

The NodeSet CRD from the fixtures is installed and a DaemonSet-mode NodeSet selects nodes by
the hand-off label. There is no Slinky operator here, so the test plays its part: once the
Node carries the label the NodeSet selects, it starts the dynamic ``slurmd -Z``. The hand-off
must leave exactly the specified labels and annotations, and ``registering`` must end only when
Slurm reports the node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from provisioner.config import SlurmSettings
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.kube.model import ANNOTATION_CORDON, LABEL_NODE_ID, LABEL_OPERANDS
from provisioner.kube.sync import SLINKY_CORDON_REASON
from provisioner.lifecycle.validation import validation_passed
from provisioner.slurm.handoff import SLINKY_TOPOLOGY, SlurmHandoff
from provisioner.slurm.maintenance import SlurmFirstKube
from provisioner.slurm.scontrol import ScontrolSlurm
from tests.integration.kube_support import connected, domain_node, kube_settings, poll
from tests.peers.kube import KubeCluster
from tests.peers.kube_admin import KubeAdmin
from tests.peers.slurm import (
    Slurm,
    jwt_extra,
    open_workdir,
    running_munged,
    running_slurmctld,
    running_slurmd,
    slurm_unavailable_reason,
)

pytestmark = [pytest.mark.root, pytest.mark.timeout(180)]
CRD = Path(__file__).resolve().parents[1] / "fixtures" / "slinky" / "slinky.slurm.net_nodesets.yaml"
HOST = "slinky-gpu-01"
LABEL = "provisioner.io/slurm-nodeset"
SPEC = "default:leaf-01:spine-01"
NAMESPACE = "slurm"


@pytest.fixture(scope="module")
def slurm() -> Iterator[tuple[Slurm, Path]]:
    if (reason := slurm_unavailable_reason()) is not None:
        pytest.skip(reason)
    with open_workdir("slurm-slinky-") as workdir, running_munged() as sock, \
            running_slurmctld(workdir, [], None, sock, plugin="topology/none",
                              extra=jwt_extra(workdir)) as ctld:
        yield ctld, workdir


def install_nodeset(admin: KubeAdmin, name: str = "gpu-h100") -> dict[str, Any]:
    """The CRD (until Established), a namespace and a NodeSet selecting ``LABEL=<name>``."""
    ext = client.ApiextensionsV1Api(admin.api)
    crd = yaml.safe_load(CRD.read_text())
    try:
        ext.create_custom_resource_definition(crd)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    wait_established(ext, crd["metadata"]["name"])
    try:
        admin.create_namespace(NAMESPACE)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    nodeset = {
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"controllerRef": {"name": "slurm"}, "scalingMode": "DaemonSet",
                 "slurmd": {"image": "ghcr.io/slinkyproject/slurmd:25.05"},
                 "template": {"spec": {
                     "nodeSelector": {LABEL: name},
                     "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]}}}}
    objects = client.CustomObjectsApi(admin.api)
    return dict(objects.create_namespaced_custom_object(
        "slinky.slurm.net", "v1beta1", NAMESPACE, "nodesets", nodeset))


def wait_established(ext: Any, name: str) -> None:
    for _ in range(100):
        conds = ext.read_custom_resource_definition(name).status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conds):
            return
        time.sleep(0.1)
    raise AssertionError(f"CRD {name} not Established")


def selected(nodeset: dict[str, Any], labels: dict[str, str]) -> bool:
    selector = nodeset["spec"]["template"]["spec"]["nodeSelector"]
    return all(labels.get(k) == v for k, v in selector.items())


async def never(*args: object) -> None:
    raise AssertionError("the hand-off must not run kubeadm join")


async def test_handoff_labels_register_drain_and_retire(
        kube_cluster: KubeCluster, slurm: tuple[Slurm, Path]) -> None:
    ctld, workdir = slurm
    admin = KubeAdmin(kube_cluster)
    nodeset = await asyncio.to_thread(install_nodeset, admin)
    node = domain_node(HOST, profile="gpu-worker")
    held = {LABEL_NODE_ID: str(node.id), LABEL_OPERANDS: "false"}  # as the joiner left it
    await asyncio.to_thread(admin.create_node, HOST, labels=held)
    before = (await asyncio.to_thread(admin.node, HOST)).metadata
    assert not selected(nodeset, before.labels)
    settings = SlurmSettings(nodesets={"gpu-worker": "gpu-h100"}, register_timeout_s=60,
                             drain_timeout_s=20, poll_interval_s=0.2)
    kube_cfg = kube_settings(kube_cluster)
    async with connected(kube_cfg) as kube:
        seen_by_gpu_wait: list[dict[str, str]] = []

        async def gpu_ready(n: object) -> None:  # runs after the release, before the label
            seen_by_gpu_wait.append((await kube.get_node(HOST)).labels)

        handoff = SlurmHandoff(ScontrolSlurm(slurm_conf=ctld.conf), settings, kube=kube,
                               topology_spec=lambda n: SPEC, gpu_ready=gpu_ready)
        register = asyncio.create_task(handoff.register(node))

        def labelled() -> dict[str, str] | None:
            labels = admin.node(HOST).metadata.labels
            return labels if selected(nodeset, labels) else None

        labels = await poll(labelled, timeout_s=20, what="NodeSet label")
        await asyncio.sleep(0.5)
        assert not register.done()  # Slurm has not reported the node yet
        with running_slurmd(ctld, workdir, HOST):  # what Slinky's DaemonSet pod would run
            await asyncio.wait_for(register, 60)
            after = (await asyncio.to_thread(admin.node, HOST)).metadata
            want_labels = {k: v for k, v in before.labels.items() if k != LABEL_OPERANDS}
            assert after.labels == {**want_labels, LABEL: "gpu-h100"} == labels
            assert after.annotations == {**before.annotations, SLINKY_TOPOLOGY: SPEC}
            [gpu_wait_labels] = seen_by_gpu_wait
            assert LABEL_OPERANDS not in gpu_wait_labels and LABEL not in gpu_wait_labels
            assert "State=IDLE" in ctld.scontrol("show", "node", HOST)

            joiner = SlurmFirstKube(
                KubeNodeJoiner(kube, kube_cfg, never, validated=validation_passed), handoff)
            await joiner.maintenance(node, True, "swap PSU")
            meta = await asyncio.to_thread(admin.node, HOST)
            assert meta.spec.unschedulable is True
            assert meta.metadata.annotations[SLINKY_CORDON_REASON] == "swap PSU"
            assert meta.metadata.annotations[ANNOTATION_CORDON] == "swap PSU"
            shown = ctld.scontrol("show", "node", HOST)
            assert "State=IDLE+DRAIN" in shown and "Reason=provisioner: swap PSU" in shown

            await joiner.maintenance(node, False, "")
            meta = await asyncio.to_thread(admin.node, HOST)
            assert not meta.spec.unschedulable
            assert meta.metadata.annotations == after.annotations
            assert "DRAIN" not in ctld.scontrol("show", "node", HOST)

        # retire once the worker's pod is gone (a live ``slurmd -Z`` registers the node again
        # after it is deleted: the test raced it)
        await handoff.remove(node)
        gone = (await asyncio.to_thread(admin.node, HOST)).metadata
        assert LABEL not in gone.labels
        assert HOST not in ctld.scontrol("show", "node")
    admin.close()
