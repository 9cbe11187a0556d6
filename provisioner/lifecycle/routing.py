"""Per-node driver choice: simulated nodes (fake BMC) use the simulation's drivers; real
nodes use the real ones, or ``Unavailable`` where the configuration leaves one out."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from provisioner.domain import Node, Sanitised
from provisioner.errors import FatalError
from provisioner.lifecycle.ports import (
    Inspector,
    Installer,
    KubeJoiner,
    Note,
    Recollect,
    Repairer,
    SlurmRegistrar,
    Validator,
)
from provisioner.lifecycle.service_ports import (
    Baseline,
    ServiceBmc,
    Servicing,
    TaskLimits,
    UpdateImage,
)
from provisioner.validation.record import ValidationRecord


def is_simulated(node: Node) -> bool:
    return node.bmc is not None and node.bmc.driver == "fake"


class Unavailable:
    """Stands in for a driver the configuration leaves out; fails the step saying what to
    configure."""

    def __init__(self, what: str, fix: str) -> None:
        self._what = what
        self._fix = fix

    def _fail(self) -> FatalError:
        return FatalError(f"{self._what} is not configured: {self._fix}")

    async def inspect(self, node: Node) -> dict[str, Any]:
        raise self._fail()

    async def deploy_image(self, node: Node, generation: str) -> None:
        raise self._fail()

    async def configure(self, node: Node, generation: str) -> None:
        raise self._fail()

    async def collect_facts(self, node: Node, generation: str) -> None:
        raise self._fail()

    async def sanitise(self, node: Node, generation: str, skip: frozenset[str]) -> Sanitised:
        raise self._fail()

    async def build_arrays(self, node: Node, generation: str,
                           arrays: list[dict[str, Any]]) -> dict[str, Any]:
        raise self._fail()

    async def join(self, node: Node) -> None:
        raise self._fail()

    async def register(self, node: Node) -> None:
        raise self._fail()

    async def remove(self, node: Node) -> None:
        return None  # nothing was ever added by a driver that does not exist

    async def maintenance(self, node: Node, on: bool, reason: str) -> None:
        return None  # nothing runs there to drain


class RoutedInspector:
    def __init__(self, simulated: Inspector, real: Inspector) -> None:
        self._simulated, self._real = simulated, real

    async def inspect(self, node: Node) -> dict[str, Any]:
        chosen = self._simulated if is_simulated(node) else self._real
        return await chosen.inspect(node)


class RoutedInstaller:
    def __init__(self, simulated: Installer, real: Installer) -> None:
        self._simulated, self._real = simulated, real

    def _pick(self, node: Node) -> Installer:
        return self._simulated if is_simulated(node) else self._real

    async def deploy_image(self, node: Node, generation: str) -> None:
        await self._pick(node).deploy_image(node, generation)

    async def configure(self, node: Node, generation: str) -> None:
        await self._pick(node).configure(node, generation)

    async def collect_facts(self, node: Node, generation: str) -> None:
        await self._pick(node).collect_facts(node, generation)

    async def sanitise(self, node: Node, generation: str, skip: frozenset[str]) -> Sanitised:
        return await self._pick(node).sanitise(node, generation, skip)

    async def build_arrays(self, node: Node, generation: str,
                           arrays: list[dict[str, Any]]) -> dict[str, Any]:
        return await self._pick(node).build_arrays(node, generation, arrays)


class RoutedKube:
    def __init__(self, simulated: KubeJoiner, real: KubeJoiner) -> None:
        self._simulated, self._real = simulated, real

    async def join(self, node: Node) -> None:
        await (self._simulated if is_simulated(node) else self._real).join(node)

    async def remove(self, node: Node) -> None:
        await (self._simulated if is_simulated(node) else self._real).remove(node)

    async def maintenance(self, node: Node, on: bool, reason: str) -> None:
        await (self._simulated if is_simulated(node) else self._real).maintenance(
            node, on, reason)


class RoutedSlurm:
    def __init__(self, simulated: SlurmRegistrar, real: SlurmRegistrar) -> None:
        self._simulated, self._real = simulated, real

    async def register(self, node: Node) -> None:
        await (self._simulated if is_simulated(node) else self._real).register(node)

    async def remove(self, node: Node) -> None:
        await (self._simulated if is_simulated(node) else self._real).remove(node)


class RoutedValidator:
    """Simulated nodes pass the simulation's validator; real ones face the real checks."""

    def __init__(self, simulated: Validator, real: Validator) -> None:
        self._simulated, self._real = simulated, real

    def _pick(self, node: Node) -> Validator:
        return self._simulated if is_simulated(node) else self._real

    async def check(self, node: Node) -> ValidationRecord:
        return await self._pick(node).check(node)

    async def wait_domain(self, node: Node, record: ValidationRecord, note: Note) -> None:
        await self._pick(node).wait_domain(node, record, note)

    async def check_sku(self, node: Node) -> ValidationRecord:
        return await self._pick(node).check_sku(node)

    async def settle(self, node: Node, record: ValidationRecord, since: datetime,
                     recollect: Recollect, note: Note) -> ValidationRecord:
        return await self._pick(node).settle(node, record, since, recollect, note)


class RoutedRepairs:
    """The repair ladder's drains and rungs: simulated machines, or the real drivers."""

    def __init__(self, simulated: Repairer, real: Repairer) -> None:
        self._simulated, self._real = simulated, real

    def _pick(self, node: Node) -> Repairer:
        return self._simulated if is_simulated(node) else self._real

    async def drain(self, node: Node, reason: str, wait_jobs_s: float) -> str:
        return await self._pick(node).drain(node, reason, wait_jobs_s)

    async def undrain(self, node: Node) -> None:
        await self._pick(node).undrain(node)

    async def reset_gpus(self, node: Node) -> None:
        await self._pick(node).reset_gpus(node)

    async def restart_os(self, node: Node) -> None:
        await self._pick(node).restart_os(node)

    async def wait_os(self, node: Node) -> None:
        await self._pick(node).wait_os(node)


class RoutedServicing:
    """The site's runbooks and baselines; a simulated node's BMC for servicing is the
    simulation's (``simulated(node)``), a real node's the site's Redfish one."""

    def __init__(self, real: Servicing, simulated: Callable[[Node], ServiceBmc]) -> None:
        self._real, self._simulated = real, simulated

    def runbook(self, name: str) -> tuple[str, ...]:
        return self._real.runbook(name)

    def onboarding(self, node: Node) -> str | None:
        return self._real.onboarding(node)

    def baseline(self, node: Node) -> Baseline:
        return self._real.baseline(node)

    def wave_runbook(self, profile: str) -> str | None:
        return self._real.wave_runbook(profile)

    def image_uri(self, image: str) -> str:
        return self._real.image_uri(image)

    def update_image(self, node: Node, image: str) -> UpdateImage:
        return self._real.update_image(node, image)

    @property
    def limits(self) -> TaskLimits:
        return self._real.limits

    async def bmc(self, node: Node) -> ServiceBmc:
        return self._simulated(node) if is_simulated(node) else await self._real.bmc(node)
