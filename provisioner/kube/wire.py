"""Raw Kubernetes JSON (as ``kube.client`` reads it) parsed into the plain values of
``kube.model``. Pure: no client, no I/O."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import yaml

from provisioner.kube.model import (
    ClusterInfo,
    Condition,
    ConfigMapInfo,
    KubeRejected,
    NodeInfo,
    NodeWatch,
    PodInfo,
    Taint,
)


def time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def node(obj: Mapping[str, Any]) -> NodeInfo:
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
    return NodeInfo(
        name=meta["name"],
        resource_version=meta.get("resourceVersion", ""),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        taints=tuple(Taint(key=t["key"], effect=t["effect"], value=t.get("value") or "")
                     for t in spec.get("taints") or []),
        unschedulable=bool(spec.get("unschedulable")),
        provider_id=spec.get("providerID") or "",
        conditions=tuple(Condition(type=c["type"], status=c["status"],
                                   reason=c.get("reason") or "", message=c.get("message") or "",
                                   last_transition=time(c.get("lastTransitionTime")))
                         for c in status.get("conditions") or []),
        allocatable={k: str(v) for k, v in (status.get("allocatable") or {}).items()},
    )


WATCH_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED"})


def node_watch(lines: Iterable[bytes], resource_version: str) -> NodeWatch:
    """A watch's stream of Nodes (one JSON event a line) → its events and the version to go
    on from. A line that is not a watch event of a Node is refused (``KubeRejected``: the
    caller lists again), never skipped: a lost change would stay lost until then."""
    events: list[tuple[str, NodeInfo]] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            kind, obj = doc["type"], doc["object"]
            meta = obj.get("metadata") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:  # "too old resource version": list again
                    return NodeWatch(tuple(events), resource_version, expired=True)
                raise KubeRejected(f"watch of nodes: {obj.get('code')} {obj.get('message')}")
            resource_version = str(meta.get("resourceVersion") or resource_version)
            if kind in WATCH_EVENTS:
                events.append((kind, node(obj)))
            elif kind != "BOOKMARK":
                raise KubeRejected(f"watch of nodes: unknown event type {kind!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KubeRejected(f"watch of nodes: malformed event ({type(exc).__name__}: "
                               f"{exc})") from None
    return NodeWatch(tuple(events), resource_version)


def pod(obj: Mapping[str, Any]) -> PodInfo:
    meta, spec = obj.get("metadata", {}), obj.get("spec", {})
    annotations = meta.get("annotations") or {}
    return PodInfo(
        namespace=meta.get("namespace", ""),
        name=meta["name"],
        node_name=spec.get("nodeName") or "",
        owner_kinds=tuple(ref.get("kind", "") for ref in meta.get("ownerReferences") or []),
        mirror="kubernetes.io/config.mirror" in annotations,
        deleting=meta.get("deletionTimestamp") is not None,
        phase=(obj.get("status") or {}).get("phase") or "",
    )


def config_map(obj: Mapping[str, Any]) -> ConfigMapInfo:
    meta = obj.get("metadata", {})
    return ConfigMapInfo(namespace=meta.get("namespace", ""), name=meta["name"],
                         resource_version=meta.get("resourceVersion", ""),
                         data={k: str(v) for k, v in (obj.get("data") or {}).items()},
                         annotations=dict(meta.get("annotations") or {}))


def cluster_info(configmap: Mapping[str, Any]) -> ClusterInfo:
    text = (configmap.get("data") or {}).get("kubeconfig")
    if not text:
        raise KubeRejected("kube-public/cluster-info has no kubeconfig")
    try:
        cluster = yaml.safe_load(text)["clusters"][0]["cluster"]
        return ClusterInfo(server=str(cluster["server"]),
                           ca_pem=base64.b64decode(cluster["certificate-authority-data"]))
    except (yaml.YAMLError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise KubeRejected(f"kube-public/cluster-info: malformed kubeconfig ({exc})") from None
