"""Build the live topology and its sinks from the settings (called by ``daemon.py``)."""

from __future__ import annotations

from provisioner.config import Settings
from provisioner.kube.client import KubeClient
from provisioner.store.store import Store
from provisioner.topology_live.live import LiveTopology, Publisher
from provisioner.topology_live.publish_file import FilePublisher
from provisioner.topology_live.publish_kube import KubePublisher


def build_live_topology(settings: Settings, store: Store,
                        kube: KubeClient | None) -> LiveTopology:
    """The sinks that are configured: Kubernetes (labels, annotation, ConfigMap) when a
    cluster is, the classic Slurm file when a path is set."""
    topology = settings.topology
    publishers: list[Publisher] = []
    configmap = None
    if topology.publish_configmap is not None:
        namespace, _, name = topology.publish_configmap.partition("/")
        configmap = (namespace, name)
    if kube is not None and (topology.publish_labels or configmap is not None):
        publishers.append(KubePublisher(kube, labels=topology.publish_labels,
                                        configmap=configmap))
    if topology.slurm_topology_file is not None:
        publishers.append(FilePublisher(topology.slurm_topology_file, topology.reload_command,
                                        reload_timeout_s=topology.reload_timeout_s))
    return LiveTopology(store.topology, topology, publishers)
