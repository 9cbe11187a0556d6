"""``KubeJoiner`` that drains in Slurm before Kubernetes evicts: the issue's order for a node
handed to Slurm is cordon + ``node-cordon-reason`` → Slurm DRAIN → wait until Slurm reports it
drained and idle → evict the pods (a busy slurmd pod is protected by a PDB anyway).
Off: uncordon in Kubernetes, then resume in Slurm. join/remove pass through."""

from __future__ import annotations

from typing import Protocol

from provisioner.domain import Node
from provisioner.slurm.handoff import SlurmHandoff


class KubeJoiner(Protocol):
    """The Kubernetes side this wraps (``kube.joiner.KubeNodeJoiner``); the same shape as the
    lifecycle's ``KubeJoiner`` port, which ``SlurmFirstKube`` itself implements."""

    async def join(self, node: Node) -> None: ...

    async def maintenance(self, node: Node, on: bool, reason: str) -> None: ...

    async def remove(self, node: Node) -> None: ...


class SlurmFirstKube:
    def __init__(self, kube: KubeJoiner, slurm: SlurmHandoff) -> None:
        self._kube = kube
        self._slurm = slurm

    async def join(self, node: Node) -> None:
        await self._kube.join(node)

    async def maintenance(self, node: Node, on: bool, reason: str = "maintenance") -> None:
        if on:
            await self._slurm.maintenance(node, True, reason)
            await self._kube.maintenance(node, True, reason)
        else:
            await self._kube.maintenance(node, False, reason)
            await self._slurm.maintenance(node, False, reason)

    async def remove(self, node: Node) -> None:
        await self._kube.remove(node)
