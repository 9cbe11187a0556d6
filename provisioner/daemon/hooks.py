"""What Ansible, Kubernetes and Slurm report, into the conductor: Ansible task events as
history rows, a cordon or drain made there as the maintenance flag."""

from __future__ import annotations

from provisioner.errors import NotFound
from provisioner.install.base import InstallEvent, OnEvent
from provisioner.kube.sync import OnChange
from provisioner.lifecycle.conductor import Conductor
from provisioner.store.store import Store


def ansible_to_history(conductor: Conductor) -> OnEvent:
    """Ansible task events (changes, failures, recaps) -> history rows, no state change."""

    async def on_event(node_id: str, event: InstallEvent) -> None:
        await conductor.record(node_id, "ansible", actor="ansible", reason=event.summary())

    return on_event


def maintenance_from(actor: str, store: Store, conductor: Conductor) -> OnChange:
    """Kubernetes or Slurm -> daemon: a cordon, a long NotReady or a drain made there
    becomes the maintenance flag (with its reason and a history row by ``actor``), without
    draining again. Nodes that are not ours are ignored."""

    async def on_change(hostname: str, maintenance: bool, reason: str) -> None:
        try:
            node = await store.nodes.find(hostname)
        except NotFound:
            return
        await conductor.set_maintenance(node.id, maintenance, actor=actor, reason=reason,
                                        propagate=False)

    return on_change
