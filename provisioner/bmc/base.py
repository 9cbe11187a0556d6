"""The BMC seam: one small async protocol; drivers implement only single calls."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Protocol

from provisioner.domain import BmcCredentials, BmcEndpoint


class PowerState(StrEnum):
    ON = "on"
    OFF = "off"


class BootDevice(StrEnum):
    PXE = "pxe"
    HTTP = "http"
    DISK = "disk"
    BIOS = "bios"


class Bmc(Protocol):
    """One node's BMC. Idempotent: requesting the current state is success, not an error."""

    async def power_state(self) -> PowerState: ...

    async def set_power(self, state: PowerState) -> None: ...

    async def set_boot_device(self, device: BootDevice, *, persistent: bool = False) -> None: ...

    async def aclose(self) -> None: ...


BmcFactory = Callable[[str, BmcEndpoint, BmcCredentials], Bmc]
"""(node id, endpoint, credentials) -> Bmc"""
