"""``SiteRepairs``: the repair ladder's ``Repairer`` for real nodes. Drains in Slurm and
cordons in Kubernetes with one text (Slurm's reason prefix included, so both show the same
words and our own sync knows the drain is ours), through the existing maintenance paths:
``SlurmHandoff`` (cordon, DRAIN, the wait for jobs) and the Kubernetes joiner (eviction).
The in-band rungs are Ansible playbooks (``gpu-reset.yml``, ``reboot.yml``, ``wait-os.yml``)."""

from __future__ import annotations

from typing import Protocol

from provisioner.domain import Node
from provisioner.slurm.handoff import SlurmHandoff


class KubeMaintenance(Protocol):
    async def maintenance(self, node: Node, on: bool, reason: str = "maintenance") -> None: ...


class Remedies(Protocol):
    """The in-band rungs (``install.installer.AnsibleInstaller`` implements them)."""

    async def reset_gpus(self, node: Node) -> None: ...

    async def restart_os(self, node: Node, timeout_s: float) -> None: ...

    async def wait_os(self, node: Node, timeout_s: float) -> None: ...


class SiteRepairs:
    def __init__(self, remedies: Remedies, *, handoff: SlurmHandoff | None = None,
                 kube: KubeMaintenance | None = None, os_up_timeout_s: float = 900.0) -> None:
        self._remedies = remedies
        self._os_up_s = os_up_timeout_s
        self._handoff = handoff
        self._kube = kube

    def reason(self, text: str) -> str:
        """The one text both Slurm and Kubernetes show."""
        return self._handoff.reason(text) if self._handoff is not None else text

    async def drain(self, node: Node, reason: str, wait_jobs_s: float) -> str:
        text = self.reason(reason)
        still = ""
        if self._handoff is not None:
            still = await self._handoff.drain_for_repair(node, text, wait_jobs_s)
        if self._kube is not None and node.hostname:
            await self._kube.maintenance(node, True, text)  # cordon (same text), evict
        return still

    async def undrain(self, node: Node) -> None:
        if self._kube is not None and node.hostname:
            await self._kube.maintenance(node, False, "")
        if self._handoff is not None:
            await self._handoff.maintenance(node, False)  # resume in Slurm, uncordon

    async def reset_gpus(self, node: Node) -> None:
        await self._remedies.reset_gpus(node)

    async def restart_os(self, node: Node) -> None:
        await self._remedies.restart_os(node, self._os_up_s)

    async def wait_os(self, node: Node) -> None:
        await self._remedies.wait_os(node, self._os_up_s)
