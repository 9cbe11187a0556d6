"""labels.py (pure): what a Node must carry, and the one patch that gets it there."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from provisioner.config import KubeProfile, is_nfd_key
from provisioner.domain import Node
from provisioner.ids import NodeId
from provisioner.kube.labels import compute_patch, desired_metadata, label_value
from provisioner.kube.model import (
    ANNOTATION_MANAGED,
    LABEL_DRIVER,
    LABEL_OPERANDS,
    KubeRejected,
    NodeInfo,
    Taint,
)
from provisioner.lifecycle.states import NodeState

PROFILE = KubeProfile(labels={"example.com/pool": "train"}, annotations={"example.com/a": "1"},
                      taints=["nvidia.com/gpu=present:NoSchedule"], host_driver=True)


def node(**fields: Any) -> Node:
    now = datetime.now(UTC)
    base = Node(id=NodeId("n1"), state=NodeState.JOINING, hostname="gpu-1", serial="S1",
                macs=("52:54:00:00:00:01",), maintenance=False, maintenance_reason="",
                profile="gpu-worker", rack="Rack 7/A", position="U12", facts={},
                last_error="", checkpoint=(), version=1, history_seq=0, bmc=None,
                created_at=now, updated_at=now)
    return replace(base, **fields)


def apply(info: NodeInfo, patch: dict[str, Any] | None) -> NodeInfo:
    """What the apiserver's strategic merge does with our patches (maps merge, taints replace)."""
    if patch is None:
        return info
    meta = patch.get("metadata", {})

    def merged(current: dict[str, str], change: dict[str, str | None]) -> dict[str, str]:
        out = dict(current)
        for key, value in change.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = value
        return out

    taints = info.taints
    if "spec" in patch:
        taints = tuple(Taint(t["key"], t["effect"], t.get("value", ""))
                       for t in patch["spec"]["taints"])
    return replace(info, labels=merged(info.labels, meta.get("labels", {})),
                   annotations=merged(info.annotations, meta.get("annotations", {})),
                   taints=taints, resource_version=info.resource_version + "'")


def test_desired_metadata_holds_operands_until_validated() -> None:
    held = desired_metadata(node(), PROFILE, validated=False, extra_labels={"topo/leaf": "s1"})
    assert held.labels == {
        "provisioner.io/node-id": "n1", "provisioner.io/profile": "gpu-worker",
        "provisioner.io/rack": "Rack-7-A", "provisioner.io/position": "U12",
        "topo/leaf": "s1", "example.com/pool": "train", LABEL_DRIVER: "false",
        LABEL_OPERANDS: "false"}
    assert held.annotations == {"example.com/a": "1", "provisioner.io/serial": "S1",
                                "provisioner.io/macs": "52:54:00:00:00:01"}
    assert held.taints == (Taint("nvidia.com/gpu", "NoSchedule", "present"),)
    released = desired_metadata(node(), PROFILE, validated=True)
    assert LABEL_OPERANDS not in released.labels


def test_patch_is_idempotent_and_removes_what_we_no_longer_want() -> None:
    info = NodeInfo(name="gpu-1", resource_version="1", labels={"kubernetes.io/hostname": "gpu-1"},
                    taints=(Taint("kwok.x-k8s.io/node", "NoSchedule", "fake"),))
    held = desired_metadata(node(), PROFILE, validated=False)
    patch = compute_patch(info, held)
    assert patch is not None and patch["metadata"]["resourceVersion"] == "1"  # taints changed
    info = apply(info, patch)
    assert compute_patch(info, held) is None  # second run: no request

    released = desired_metadata(node(), KubeProfile(), validated=True)
    patch = compute_patch(info, released)
    assert patch is not None
    assert patch["metadata"]["labels"][LABEL_OPERANDS] is None
    assert patch["metadata"]["labels"]["example.com/pool"] is None
    assert patch["spec"]["taints"] == [{"key": "kwok.x-k8s.io/node", "effect": "NoSchedule",
                                        "value": "fake"}]  # someone else's taint stays
    info = apply(info, patch)
    assert "kubernetes.io/hostname" in info.labels
    assert json.loads(info.annotations[ANNOTATION_MANAGED])["taints"] == []
    assert compute_patch(info, released) is None


def test_labels_only_patch_carries_no_resource_version() -> None:
    info = NodeInfo(name="gpu-1", resource_version="9")
    patch = compute_patch(info, desired_metadata(node(), KubeProfile(), validated=False))
    assert patch is not None and "resourceVersion" not in patch["metadata"]
    assert "spec" not in patch


@pytest.mark.parametrize("labels", [{"feature.node.kubernetes.io/pci-10de.present": "true"},
                                    {"gpu.feature.node.kubernetes.io/x": "1"}],
                         ids=["nfd", "nfd-subdomain"])
def test_profiles_may_not_set_nfd_labels(labels: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="node-feature-discovery"):
        KubeProfile(labels=labels)
    with pytest.raises(KubeRejected, match="NFD"):
        desired_metadata(node(), KubeProfile(), validated=True, extra_labels=labels)


def test_nfd_key_rule() -> None:
    assert is_nfd_key("feature.node.kubernetes.io/cpu-model.vendor_id")
    assert is_nfd_key("nfd.node.kubernetes.io/extended-resources")
    assert not is_nfd_key("nvidia.com/gpu.present")
    assert not is_nfd_key("feature.node.kubernetes.io")


@pytest.mark.parametrize("taint", ["nokey", "k=v:Sometimes", ":NoSchedule"])
def test_bad_taints_are_refused_at_start(taint: str) -> None:
    with pytest.raises(ValidationError, match="taint"):
        KubeProfile(taints=[taint])


def test_invalid_profile_label_is_rejected() -> None:
    with pytest.raises(KubeRejected, match="not a valid Kubernetes label"):
        desired_metadata(node(), KubeProfile(labels={"bad key!": "x"}), validated=True)


@pytest.mark.parametrize(("text", "value"), [("Rack 7/A", "Rack-7-A"), ("-x-", "x"),
                                             ("a" * 70, "a" * 63), ("U12", "U12")])
def test_label_value(text: str, value: str) -> None:
    assert label_value(text) == value


COMPUTE_DOMAIN = "resource.nvidia.com/computeDomain"


def test_the_dra_drivers_compute_domain_label_is_never_ours() -> None:
    """GB200/GB300: the NVIDIA DRA driver labels the nodes of a ComputeDomain; our label
    writes neither set it (refused, at start and at apply) nor remove it (even listed as
    ours in an old managed annotation)."""
    with pytest.raises(ValidationError, match="NVIDIA DRA driver"):
        KubeProfile(labels={COMPUTE_DOMAIN: "cd-1"})
    with pytest.raises(KubeRejected, match="NVIDIA DRA driver"):
        desired_metadata(node(), KubeProfile(), validated=True,
                         extra_labels={COMPUTE_DOMAIN: "cd-1"})
    managed = json.dumps({"labels": [COMPUTE_DOMAIN, "example.com/pool"], "annotations": [],
                          "taints": []})
    info = NodeInfo(name="gb200-1", resource_version="3",
                    labels={COMPUTE_DOMAIN: "3f1c-uid", "example.com/pool": "a"},
                    annotations={ANNOTATION_MANAGED: managed})
    patch = compute_patch(info, desired_metadata(node(), KubeProfile(), validated=True))
    assert patch is not None and COMPUTE_DOMAIN not in patch["metadata"]["labels"]
    assert apply(info, patch).labels[COMPUTE_DOMAIN] == "3f1c-uid"
