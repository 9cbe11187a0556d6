"""What the ``servicing`` step drives (issue 25): the node's BMC as far as servicing needs it
(BIOS and its attribute registry, its own settings, the firmware inventory, UpdateService),
and the site's runbooks and baselines. The daemon's implementation is
``provisioner.bmc.redfish_service``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from provisioner.domain import Node
from provisioner.errors import FatalError, InvalidRequest
from provisioner.validation.baseline import (
    Baseline,
    BiosValue,
    BmcSetting,
    Component,
    TaskLimits,
    TaskState,
    UpdateImage,
)
from provisioner.validation.bmc_settings import Applied, BmcView
from provisioner.validation.storage import Controller

__all__ = ["Baseline", "NoServicing", "ServiceBmc", "Servicing", "TaskLimits", "TaskState",
           "UpdateImage"]


class ServiceBmc(Protocol):
    """One node's BMC for servicing; every error is a DriverError with the BMC's message."""

    async def bios_registry(self) -> Mapping[str, object]: ...

    async def bios_attributes(self) -> Mapping[str, object]: ...

    async def apply_bios(self, changes: Mapping[str, BiosValue]) -> str:
        """Write ``changes`` to the pending settings; returns the apply time used
        (``OnReset``: the next reset applies them, ``Immediate``)."""
        ...

    async def bmc_view(self, *, registry: bool) -> BmcView:
        """The BMC's own settings (manager attributes, NetworkProtocol, Manager); with
        ``registry``, the manager attribute registry besides."""
        ...

    async def apply_bmc(self, changes: Mapping[str, BmcSetting]) -> Applied:
        """Write ``changes`` with the apply time the BMC supports."""
        ...

    async def reset_bmc(self) -> str:
        """``Manager.Reset``; returns the reset type used."""
        ...

    async def firmware_inventory(self) -> list[Component]: ...

    async def simple_update(self, image_uri: str, targets: list[str]) -> str:
        """``UpdateService.SimpleUpdate``; returns the task monitor's URI ('' where the BMC
        gave none: the update finished in the call)."""
        ...

    async def transfer(self, image: UpdateImage) -> str:
        """``SimpleUpdate`` or ``MultipartHttpPushUri``: how this BMC takes ``image``
        (``validation.baseline.choose_transfer``); BmcUnsupported saying why neither."""
        ...

    async def push_update(self, path: str, targets: list[str]) -> str:
        """Stream the file to the UpdateService's ``MultipartHttpPushUri``; the task
        monitor's URI ('' where the BMC gave none)."""
        ...

    async def task_ids(self) -> list[str] | None:
        """The TaskService's tasks now (a push's intent keeps them: its task is a new one);
        None when the BMC has none."""
        ...

    async def task(self, uri: str) -> TaskState: ...

    async def tasks_for(self, image_uri: str,
                        known: Sequence[str] | None = None) -> list[str] | None:
        """The BMC's tasks that update from ``image_uri`` (their payload names it; with
        ``known``, a push: the tasks not in ``known`` whose payload is a POST to the push
        URI), else those still running; None when the BMC has no TaskService to ask."""
        ...

    async def storage(self) -> list[Controller]:
        """The System's storage controllers with a Volumes collection, their drives and
        volumes; BmcUnsupported where the BMC has none."""
        ...

    async def create_volume(self, controller: Controller, name: str, raid: str,
                            drives: Sequence[str]) -> str:
        """POST to the controller's Volumes; the task monitor's URI, '' when done at once."""
        ...

    async def delete_volume(self, controller: Controller, uri: str) -> str: ...

    async def change_tasks(self, method: str, target: str,
                           known: Sequence[str]) -> list[str] | None:
        """The BMC's tasks not in ``known`` whose payload is ``method`` on ``target`` (a
        volume change asked for before a restart); None when the BMC has no TaskService."""
        ...

    async def aclose(self) -> None: ...


class Servicing(Protocol):
    def runbook(self, name: str) -> tuple[str, ...]:
        """The runbook's steps; InvalidRequest naming the runbooks when unknown."""
        ...

    def onboarding(self, node: Node) -> str | None:
        """The node's profile's onboarding runbook; None: none."""
        ...

    def baseline(self, node: Node) -> Baseline: ...

    def wave_runbook(self, profile: str) -> str | None:
        """The runbook a firmware wave runs on ``profile``'s nodes; None: none set."""
        ...

    def image_uri(self, image: str) -> str: ...

    def update_image(self, node: Node, image: str) -> UpdateImage:
        """The image as ``firmware_update`` sends it to ``node``'s BMC: its URL, its file
        here, the profile's ``firmware_transfer``."""
        ...

    @property
    def limits(self) -> TaskLimits: ...

    async def bmc(self, node: Node) -> ServiceBmc:
        """The node's BMC for servicing; BmcUnsupported for a BMC without Redfish ("this
        BMC has no Redfish UpdateService")."""
        ...


class NoServicing:
    """No runbooks configured: none to run, and onboarding skips straight to deploying."""

    def runbook(self, name: str) -> tuple[str, ...]:
        raise InvalidRequest(f"unknown runbook {name!r}: no [servicing.runbooks] configured")

    def onboarding(self, node: Node) -> str | None:
        return None

    def baseline(self, node: Node) -> Baseline:
        return Baseline()

    def wave_runbook(self, profile: str) -> str | None:
        return None

    def image_uri(self, image: str) -> str:
        return image

    def update_image(self, node: Node, image: str) -> UpdateImage:
        return UpdateImage(image)

    @property
    def limits(self) -> TaskLimits:
        return TaskLimits()

    async def bmc(self, node: Node) -> ServiceBmc:
        raise FatalError("servicing is not configured in this daemon")
