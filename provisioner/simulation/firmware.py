"""A simulated machine's BMC as servicing sees it (issue 25): its FirmwareInventory, kept in
the SimWorld (attribute ``fw:<component>``, else ``SIMULATED_FIRMWARE``), and
``SimpleUpdate`` with a task that completes at its first poll. The version an update
installs is the one its image's name carries (``<name>-<version>.<ext>``: ``bios-1.2.0.bin``
installs 1.2.0). A machine whose attribute ``fw_fault`` is set fails every update task with
that text as the BMC's message. Each update and install is counted in the world's ledger
(``fw_update:<component>``, ``fw_install:<component>``): a test asserts none ran twice."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Final

from provisioner.errors import DriverError
from provisioner.simulation.world import SimWorld
from provisioner.validation.baseline import (
    MULTIPART_PUSH,
    SIMPLE_UPDATE,
    BiosValue,
    BmcSetting,
    Component,
    TaskState,
    UpdateImage,
)
from provisioner.validation.bmc_settings import Applied, BmcView
from provisioner.validation.storage import Controller

SIMULATED_FIRMWARE: Final = {"BMC": "25.04.1", "BIOS": "1.0.0", "HGX_FW_GPU_0": "96.00.5E.00.01",
                             "NIC.Slot.1": "28.39.1002"}
FAULT: Final = "fw_fault"
_TASKS: Final = "/redfish/v1/TaskService/Tasks/sim-"


def image_version(image_uri: str) -> str:
    stem = PurePosixPath(image_uri).name
    for suffix in PurePosixPath(stem).suffixes[-1:]:
        stem = stem[: -len(suffix)]
    return stem.rsplit("-", 1)[-1]


class SimServiceBmc:
    """``lifecycle.service_ports.ServiceBmc`` over one simulated machine."""

    def __init__(self, world: SimWorld, key: str, *, delay_s: float = 0.0) -> None:
        self._world = world
        self._key = key
        self._delay_s = delay_s

    async def bios_registry(self) -> Mapping[str, object]:
        return {"Id": "SimulatedBiosRegistry", "RegistryEntries": {"Attributes": []}}

    async def bios_attributes(self) -> Mapping[str, object]:
        return {}

    async def apply_bios(self, changes: Mapping[str, BiosValue]) -> str:
        raise DriverError("the simulated BMC has no BIOS settings")

    async def bmc_view(self, *, registry: bool) -> BmcView:
        return BmcView()

    async def apply_bmc(self, changes: Mapping[str, BmcSetting]) -> Applied:
        raise DriverError("the simulated BMC has no BMC settings")

    async def reset_bmc(self) -> str:
        raise DriverError("the simulated BMC has no Manager.Reset")

    async def firmware_inventory(self) -> list[Component]:
        return [Component(id=cid, version=await self._world.get(self._key, f"fw:{cid}")
                          or default, uri=f"/redfish/v1/UpdateService/FirmwareInventory/{cid}",
                          name=cid)
                for cid, default in SIMULATED_FIRMWARE.items()]

    async def simple_update(self, image_uri: str, targets: list[str]) -> str:
        cid = targets[0].rsplit("/", 1)[-1]
        await asyncio.sleep(self._delay_s)
        await self._world.ensure(self._key, f"fw_update:{cid}", f"fw_pending:{cid}",
                                 image_version(image_uri))
        return _TASKS + cid

    async def transfer(self, image: UpdateImage) -> str:
        return MULTIPART_PUSH if image.transfer == "multipart" else SIMPLE_UPDATE

    async def push_update(self, path: str, targets: list[str]) -> str:
        return await self.simple_update(path, targets)

    async def task_ids(self) -> list[str] | None:
        return []

    async def task(self, uri: str) -> TaskState:
        cid = uri.removeprefix(_TASKS)
        await asyncio.sleep(self._delay_s)
        fault = await self._world.get(self._key, FAULT)
        if fault:
            return TaskState("Exception", 100, (fault,))
        version = await self._world.get(self._key, f"fw_pending:{cid}")
        if not version:
            return TaskState("", gone=True)
        await self._world.ensure(self._key, f"fw_install:{cid}", f"fw:{cid}", version)
        return TaskState("Completed", 100)

    async def tasks_for(self, image_uri: str,
                        known: Sequence[str] | None = None) -> list[str] | None:
        return [_TASKS + cid for cid in SIMULATED_FIRMWARE
                if await self._world.get(self._key, f"fw_pending:{cid}")
                == image_version(image_uri)]

    async def storage(self) -> list[Controller]:
        raise DriverError("the simulated BMC has no Redfish Storage")

    async def create_volume(self, controller: Controller, name: str, raid: str,
                            drives: Sequence[str]) -> str:
        raise DriverError("the simulated BMC has no Redfish Storage")

    async def delete_volume(self, controller: Controller, uri: str) -> str:
        raise DriverError("the simulated BMC has no Redfish Storage")

    async def change_tasks(self, method: str, target: str,
                           known: Sequence[str]) -> list[str] | None:
        raise DriverError("the simulated BMC has no Redfish Storage")

    async def aclose(self) -> None:
        return None
