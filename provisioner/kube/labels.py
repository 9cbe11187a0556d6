"""A node's labels, annotations and taints: computed from its profile and facts (pure), then
applied with one idempotent patch. Keys the daemon set before and no longer wants are removed:
the ``provisioner.io/managed`` annotation remembers which keys are ours."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from provisioner.config import KubeProfile, foreign_owner, is_nfd_key
from provisioner.domain import Node
from provisioner.kube.model import (
    ANNOTATION_MACS,
    ANNOTATION_MANAGED,
    ANNOTATION_SERIAL,
    LABEL_DRIVER,
    LABEL_NODE_ID,
    LABEL_OPERANDS,
    LABEL_POSITION,
    LABEL_PROFILE,
    LABEL_RACK,
    KubeConflict,
    KubeRejected,
    NodeInfo,
    Taint,
)

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}$")
_VALUE = re.compile(rf"^({_NAME})?$")
_INVALID_CHARS = re.compile(r"[^-A-Za-z0-9_.]+")
_CONFLICT_RETRIES = 5


class NodePatcher(Protocol):
    async def get_node(self, name: str) -> NodeInfo: ...

    async def patch_node(self, name: str, body: Any) -> NodeInfo: ...


@dataclass(frozen=True, slots=True)
class DesiredMetadata:
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()


def label_value(text: str) -> str:
    """A daemon-derived value made valid as a label value ("Rack 7/A" → "Rack-7-A")."""
    return _INVALID_CHARS.sub("-", text)[:63].strip("-_.")


def desired_metadata(node: Node, profile: KubeProfile, *, validated: bool,
                     extra_labels: Mapping[str, str] | None = None) -> DesiredMetadata:
    """What the Node must carry. Operands stay held (``…deploy.operands=false``) until the
    node passed validation; NFD's keys are refused (node-feature-discovery sets them)."""
    labels: dict[str, str] = {LABEL_NODE_ID: label_value(str(node.id))}
    for key, value in ((LABEL_PROFILE, node.profile), (LABEL_RACK, node.rack),
                       (LABEL_POSITION, node.position)):
        if value and label_value(value):
            labels[key] = label_value(value)
    labels.update(extra_labels or {})
    labels.update(profile.labels)
    if profile.host_driver:
        labels[LABEL_DRIVER] = "false"
    if not validated:
        labels[LABEL_OPERANDS] = "false"
    annotations = dict(profile.annotations)
    if node.serial:
        annotations[ANNOTATION_SERIAL] = node.serial
    if node.macs:
        annotations[ANNOTATION_MACS] = ",".join(node.macs)
    taints = tuple(Taint.parse(text) for text in profile.taints)
    _check(labels, annotations, taints)
    return DesiredMetadata(labels, annotations, taints)


def _check(labels: Mapping[str, str], annotations: Mapping[str, str],
           taints: tuple[Taint, ...]) -> None:
    for key, value in labels.items():
        if is_nfd_key(key):
            raise KubeRejected(f"label {key!r}: NFD labels are node-feature-discovery's")
        if (owner := foreign_owner(key)) is not None:
            raise KubeRejected(f"label {key!r}: set by {owner}, never by provisioner")
        if not _KEY.match(key) or not _VALUE.match(value):
            raise KubeRejected(f"label {key}={value!r} is not a valid Kubernetes label")
    for key in annotations:
        if not _KEY.match(key) or key == ANNOTATION_MANAGED:
            raise KubeRejected(f"annotation key {key!r} is not allowed")
    for taint in taints:
        if not _KEY.match(taint.key) or not _VALUE.match(taint.value):
            raise KubeRejected(f"taint {taint} is not a valid Kubernetes taint")


def _managed(info: NodeInfo) -> tuple[set[str], set[str], set[tuple[str, str]]]:
    try:
        data = json.loads(info.annotations.get(ANNOTATION_MANAGED, "{}"))
        return (set(data.get("labels", [])), set(data.get("annotations", [])),
                {tuple(t.rsplit(":", 1)) for t in data.get("taints", [])})
    except (ValueError, AttributeError, TypeError):
        return set(), set(), set()


def _managed_text(desired: DesiredMetadata) -> str:
    return json.dumps({"labels": sorted(desired.labels),
                       "annotations": sorted(desired.annotations),
                       "taints": sorted(f"{t.key}:{t.effect}" for t in desired.taints)},
                      separators=(",", ":"))


def _map_patch(current: Mapping[str, str], desired: Mapping[str, str],
               previously: set[str]) -> dict[str, str | None]:
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    patch.update({k: None for k in previously - desired.keys()
                  if k in current and foreign_owner(k) is None})  # never another's key
    return patch


def compute_patch(info: NodeInfo, desired: DesiredMetadata) -> dict[str, Any] | None:
    """The strategic-merge patch that makes ``info`` carry ``desired``; None if it does."""
    old_labels, old_annotations, old_taints = _managed(info)
    annotations = {**desired.annotations, ANNOTATION_MANAGED: _managed_text(desired)}
    metadata: dict[str, Any] = {}
    if labels := _map_patch(info.labels, desired.labels, old_labels):
        metadata["labels"] = labels
    if annots := _map_patch(info.annotations, annotations, old_annotations):
        metadata["annotations"] = annots
    wanted = {(t.key, t.effect) for t in desired.taints}
    kept = [t for t in info.taints if (t.key, t.effect) not in wanted | old_taints]
    taints = kept + list(desired.taints)
    patch: dict[str, Any] = {}
    if set(taints) != set(info.taints):
        # spec.taints is replaced as a whole: guard against a concurrent writer with the
        # resourceVersion we read (409 → read again).
        patch["spec"] = {"taints": [t.as_dict() for t in taints]}
        metadata["resourceVersion"] = info.resource_version
    if metadata:
        patch["metadata"] = metadata
    return patch or None


async def apply_metadata(client: NodePatcher, info: NodeInfo,
                         desired: DesiredMetadata) -> NodeInfo:
    """Patch the Node until it carries ``desired``; no request at all if it already does."""
    for _ in range(_CONFLICT_RETRIES):
        patch = compute_patch(info, desired)
        if patch is None:
            return info
        try:
            return await client.patch_node(info.name, patch)
        except KubeConflict:
            info = await client.get_node(info.name)
    raise KubeConflict(f"node {info.name}: changed under us {_CONFLICT_RETRIES} times")
