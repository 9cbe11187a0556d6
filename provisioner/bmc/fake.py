"""The shipped ``fake`` BMC driver: acts on a simulated machine in a SimWorld, through the
``SimulatedMachines`` Protocol (the BMC layer does not import the simulation)."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from provisioner.bmc.base import BmcFactory, BootDevice, BootSetting, PowerState
from provisioner.domain import BmcCredentials, BmcEndpoint

log = logging.getLogger(__name__)


class SimulatedMachines(Protocol):
    """The simulated machines the fake BMC acts on (``simulation.world.SimWorld``)."""

    async def get(self, key: str, attr: str) -> str:
        """Machine ``key``'s attribute ``attr`` (``power``, ``bootdev``)."""
        ...

    async def ensure(self, key: str, op: str, attr: str, value: str) -> bool:
        """Set machine ``key``'s ``attr`` to ``value``, counting the call under ``op``; True
        when that changed it."""
        ...


class FakeBmc:
    def __init__(self, world: SimulatedMachines, endpoint: BmcEndpoint, *,
                 delay_s: float = 0.0) -> None:
        self._world = world
        self._key = endpoint.address
        self._delay_s = delay_s

    async def power_state(self) -> PowerState:
        return PowerState(await self._world.get(self._key, "power"))

    async def set_power(self, state: PowerState, *, soft: bool = False) -> None:
        await asyncio.sleep(self._delay_s)
        if await self._world.ensure(self._key, f"power_{state}", "power", str(state)):
            log.info("fake bmc %s: power %s", self._key, state)

    async def power_cycle(self) -> None:
        await asyncio.sleep(self._delay_s)
        await self._world.ensure(self._key, "power_cycle", "power", str(PowerState.ON))

    async def set_boot_device(self, device: BootDevice, *, persistent: bool = False,
                              uefi: bool = True, http_uri: str | None = None) -> None:
        await asyncio.sleep(self._delay_s / 5)
        await self._world.ensure(self._key, "bootdev", "bootdev", str(device))

    async def boot_device(self) -> BootSetting:
        return BootSetting(BootDevice(await self._world.get(self._key, "bootdev")))

    async def aclose(self) -> None:
        return None


def fake_bmc_factory(world: SimulatedMachines, *, delay_s: float = 0.0) -> BmcFactory:
    def make(_node_id: str, endpoint: BmcEndpoint, _credentials: BmcCredentials) -> FakeBmc:
        return FakeBmc(world, endpoint, delay_s=delay_s)

    return make
