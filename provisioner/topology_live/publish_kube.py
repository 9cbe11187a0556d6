"""Publish the live topology to Kubernetes: Topograph labels and the Slinky annotation on
each Node the daemon manages, and a ConfigMap with ``topology.conf`` and ``topology.yaml``.

Every write is a diff against what the API server holds (one LIST of the managed Nodes, one
GET of the ConfigMap), so publishing an unchanged topology writes nothing and a label someone
removed comes back. Only Nodes labelled ``provisioner.io/node-id`` are touched; on them the
daemon owns every ``fabric.topograph.run/tier-N`` and ``accelerator.topograph.run/domain``
label and the ``topology.slinky.slurm.net/spec`` annotation. A host whose Node does not
exist yet (still joining) makes the publication incomplete: the live topology retries it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from provisioner.kube.client import KubeClient
from provisioner.kube.model import LABEL_NODE_ID, PREFIX, NodeInfo
from provisioner.topology.emit import SLINKY_ANNOTATION, TOPOGRAPH_DOMAIN, TOPOGRAPH_TIER
from provisioner.topology.snapshot import Snapshot

log = logging.getLogger(__name__)
ANNOTATION_DIGEST = PREFIX + "topology-digest"
CONF_KEY, YAML_KEY = "topology.conf", "topology.yaml"


def _owned_label(key: str) -> bool:
    return key == TOPOGRAPH_DOMAIN or key.startswith(TOPOGRAPH_TIER)


def node_patch(node: NodeInfo, labels: Mapping[str, str],
               spec: str | None) -> dict[str, dict[str, str | None]] | None:
    """The merge patch taking ``node`` to the wanted labels and annotation; None: no change."""
    have = {k: v for k, v in node.labels.items() if _owned_label(k)}
    label_patch: dict[str, str | None] = {k: v for k, v in labels.items() if have.get(k) != v}
    label_patch |= {k: None for k in have if k not in labels}
    annotation_patch: dict[str, str | None] = {}
    if node.annotations.get(SLINKY_ANNOTATION) != spec:
        annotation_patch[SLINKY_ANNOTATION] = spec
    patch: dict[str, dict[str, str | None]] = {}
    if label_patch:
        patch["labels"] = label_patch
    if annotation_patch:
        patch["annotations"] = annotation_patch
    return patch or None


class KubePublisher:
    """``labels``: Node labels and annotations; ``configmap``: (namespace, name) or None."""

    name = "kubernetes"

    def __init__(self, kube: KubeClient, *, labels: bool,
                 configmap: tuple[str, str] | None) -> None:
        self._kube = kube
        self._labels = labels
        self._configmap = configmap

    async def publish(self, snapshot: Snapshot) -> bool:
        complete = True
        if self._configmap is not None:
            await self._put_config_map(snapshot, *self._configmap)
        if self._labels:
            complete = await self._label_nodes(snapshot)
        return complete

    async def _put_config_map(self, snapshot: Snapshot, namespace: str, name: str) -> None:
        data = {CONF_KEY: snapshot.topology_conf, YAML_KEY: snapshot.topology_yaml}
        current = await self._kube.get_config_map(namespace, name)
        if current is not None and current.data == data \
                and current.annotations.get(ANNOTATION_DIGEST) == snapshot.digest:
            return
        annotations = dict(current.annotations) if current is not None else {}
        annotations[ANNOTATION_DIGEST] = snapshot.digest
        await self._kube.put_config_map(
            namespace, name, data, annotations=annotations,
            resource_version=current.resource_version if current is not None else None)
        log.info("topology: configmap %s/%s written (%s)", namespace, name,
                 snapshot.digest[:12])

    async def _label_nodes(self, snapshot: Snapshot) -> bool:
        nodes = {n.name: n for n in await self._kube.list_nodes(label_selector=LABEL_NODE_ID)}
        wanted = {host.lower(): host for host in (*snapshot.labels, *snapshot.annotations)}
        written, missing = 0, []
        for name in sorted(set(nodes) | set(wanted)):
            node = nodes.get(name)
            host = wanted.get(name)
            if node is None:
                missing.append(name)
                continue
            labels = snapshot.labels.get(host, {}) if host else {}
            spec = snapshot.annotations.get(host) if host else None
            patch = node_patch(node, labels, spec)
            if patch is not None:
                await self._kube.patch_node(name, {"metadata": patch}, kind="merge")
                written += 1
        if written or missing:
            log.info("topology: %d Nodes relabelled; %d hosts have no Node yet", written,
                     len(missing))
        return not missing
