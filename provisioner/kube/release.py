"""``SlurmRegistrar`` for sites without Slurm (``slurm.enabled = false``): ``registering``
hands the validated node to Kubernetes workloads instead, releasing the GPU operand hold
and waiting for the GPU stack. Without Kubernetes either there is nothing to hand over."""

from __future__ import annotations

from typing import Protocol

from provisioner.domain import Node


class OperandReleaser(Protocol):
    async def release_operands(self, node: Node) -> None: ...


class KubeOnlyHandoff:
    def __init__(self, joiner: OperandReleaser | None) -> None:
        self._joiner = joiner

    async def register(self, node: Node) -> None:
        if self._joiner is not None:
            await self._joiner.release_operands(node)

    async def remove(self, node: Node) -> None:
        return None  # never registered anywhere; kube removal is the kube driver's
