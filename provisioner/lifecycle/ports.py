"""The seams steps drive: Protocols only. ``daemon.py`` picks the concrete drivers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from provisioner.bmc.base import BmcFactory
from provisioner.domain import Node
from provisioner.lifecycle.stagger import PowerOnStagger


class Inspector(Protocol):
    """Boots a node into inspection and returns the facts its agent reported."""

    async def inspect(self, node: Node) -> dict[str, Any]: ...


class Installer(Protocol):
    """Writes the OS and configures it. ``generation`` names one deployment, for idempotency."""

    async def deploy_image(self, node: Node, generation: str) -> None: ...

    async def configure(self, node: Node, generation: str) -> None: ...

    async def wipe(self, node: Node) -> None: ...


class KubeJoiner(Protocol):
    async def join(self, node: Node) -> None: ...

    async def maintenance(self, node: Node, on: bool, reason: str) -> None:
        """On: cordon and drain the node's workloads. Off: uncordon."""
        ...

    async def remove(self, node: Node) -> None: ...


class SlurmRegistrar(Protocol):
    async def register(self, node: Node) -> None: ...

    async def remove(self, node: Node) -> None: ...


@dataclass(frozen=True, slots=True)
class Ports:
    bmc: BmcFactory
    inspector: Inspector
    installer: Installer
    kube: KubeJoiner
    slurm: SlurmRegistrar
    stagger: PowerOnStagger = field(default_factory=PowerOnStagger.unlimited)
    """Per-rack power-on stagger (inrush); the default waits for nothing."""
