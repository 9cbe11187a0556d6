"""``node why`` reads the node's Node from a real API server (kube-apiserver + kwok): Ready,
cordoned, the labels it should carry; a Node that lost a label, or was cordoned, blocks the
node's ``kube`` step with what is wrong."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from provisioner.api.why import read_kube
from provisioner.kube.drain import cordon
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.lifecycle.schedulable import why
from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.validation import validation_passed
from provisioner.lifecycle.why import Seen
from tests.integration.kube_support import connected, domain_node, kube_settings
from tests.integration.test_kube_join import PASSED, FakeKubeadm
from tests.integration.test_kube_join import admin as admin  # noqa: F401  (fixture)
from tests.peers.kube import KubeCluster
from tests.peers.kube_admin import KubeAdmin

pytestmark = pytest.mark.timeout(120)


async def test_the_kube_step_reads_the_node_its_labels_and_its_cordon(
        kube_cluster: KubeCluster, admin: KubeAdmin) -> None:  # noqa: F811
    settings = kube_settings(kube_cluster)
    node = domain_node("gpu-why-1", serial="SER-W1")
    async with connected(settings) as kube:
        joiner = KubeNodeJoiner(kube, settings, FakeKubeadm(kube_cluster, admin),
                                validated=validation_passed)
        await joiner.join(node)
        active = dataclasses.replace(node, state=NodeState.ACTIVE, power_state="on",
                                     facts={"validation": PASSED,
                                            "last_report": {"gpus": [{"name": "H100"}]}})
        seen = await read_kube(joiner, active)
        # the Node still holds the operands (validation passed after the join): a label the
        # passed node no longer needs is not missing
        assert seen.registered and seen.missing_labels == ()
        await joiner.label(active)  # operands released
        seen = await read_kube(joiner, active)
        assert seen.registered and seen.ready and seen.cordoned is None
        assert seen.missing_labels == ()
        answer = why(active, [], [], Seen(kube=seen))
        kube_step = next(s for s in answer.steps if s.key == "kube")
        assert kube_step.status == "ok" and "Ready" in kube_step.evidence

        await asyncio.to_thread(admin.patch_node, "gpu-why-1",
                                {"metadata": {"labels": {"example.com/pool": None}}})
        seen = await read_kube(joiner, active)
        assert seen.missing_labels == ("example.com/pool=train",)
        answer = why(active, [], [], Seen(kube=seen))
        assert answer.first_blocking == "kube"
        assert "lacks labels: example.com/pool=train" in answer.steps[8].evidence

        await joiner.label(active)  # put back
        await cordon(kube, "gpu-why-1", "xid 79 on GPU 3")
        seen = await read_kube(joiner, active)
        assert seen.missing_labels == () and seen.cordoned == "xid 79 on GPU 3"
        assert why(active, [], [], Seen(kube=seen)).first_blocking == "kube"

        gone = await read_kube(joiner, dataclasses.replace(active, hostname="gpu-why-none"))
        assert not gone.registered
