"""What Ansible, Kubernetes and Slurm report, into the conductor: Ansible task events as
history rows, a cordon or drain made there as the maintenance flag."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from provisioner.errors import NotFound
from provisioner.health.records import Origin, Report
from provisioner.install.base import InstallEvent, OnEvent
from provisioner.kube.sync import OnChange
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.health import HealthFindings
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


def findings_from(health: HealthFindings,
                  origin: Origin) -> Callable[[dict[str, list[Report]]], Awaitable[int]]:
    """A sync's pass (hostname -> what it reports now) -> health findings of ``origin``."""

    async def on_findings(by_hostname: dict[str, list[Report]]) -> int:
        return await health.sync(origin, by_hostname)

    return on_findings


def fresh(health: HealthFindings, origin: Origin,
          run: Callable[[], Awaitable[None]]) -> Callable[[], Coroutine[Any, Any, None]]:
    """``run`` after forgetting what ``origin`` last reported: each time this daemon takes
    the fleet lead, its first pass reconciles with the store (another daemon led meanwhile)."""

    async def work() -> None:
        health.forget(origin)
        await run()

    return work
