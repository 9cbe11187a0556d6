"""At most N BMCs of one rack driven at once by the lifecycle steps.

GB200/GB300 NVL72 racks share a management network and power shelves among 18 compute
trays, whose BMCs each take at most 4 clients (2 kept for NVIDIA's power service). The
per-BMC limit (``bmc.per_bmc_concurrency``, 1) protects one BMC; this bounds how many of one
rack's BMCs the steps talk to at once: ``bmc.per_rack_concurrency`` for every rack, lowered
per profile by ``bmc.profile_rack_concurrency``. A step holds its rack's slot for one BMC
operation (a power change with its read-back, a boot device), never while it waits for the
OS. Work past the limit waits its turn; nothing is refused. Nodes without a rack are not
limited (nothing says which BMCs share a rack).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from provisioner.bmc.base import Bmc, BootDevice, BootSetting, PowerState
from provisioner.domain import Node


class RackBmcLimit:
    def __init__(self, per_rack: int | None = None,
                 by_profile: Mapping[str, int] | None = None) -> None:
        self._per_rack = per_rack
        self._by_profile = dict(by_profile or {})
        self._slots: dict[tuple[str, int], asyncio.Semaphore] = {}
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        """The most BMC operations ever in flight per rack (tests read it)."""

    @classmethod
    def unlimited(cls) -> RackBmcLimit:
        return cls()

    def limit_for(self, node: Node) -> int | None:
        """The node's rack limit: the lower of the site's and its profile's, None = none."""
        limits = [n for n in (self._per_rack, self._by_profile.get(node.profile or ""))
                  if n is not None]
        return min(limits) if limits and node.rack else None

    def wrap(self, bmc: Bmc, node: Node) -> Bmc:
        limit = self.limit_for(node)
        if limit is None:
            return bmc
        assert node.rack is not None
        return _RackLimitedBmc(bmc, self, node.rack, limit)

    @asynccontextmanager
    async def slot(self, rack: str, limit: int) -> AsyncIterator[None]:
        # one semaphore per (rack, limit): nodes of two profiles in one rack each keep theirs
        sem = self._slots.setdefault((rack, limit), asyncio.Semaphore(limit))
        async with sem:
            now = self.in_flight[rack] = self.in_flight.get(rack, 0) + 1
            self.max_in_flight[rack] = max(self.max_in_flight.get(rack, 0), now)
            try:
                yield
            finally:
                self.in_flight[rack] -= 1


class _RackLimitedBmc:
    """A node's Bmc whose every operation holds a slot of its rack."""

    def __init__(self, bmc: Bmc, limit: RackBmcLimit, rack: str, size: int) -> None:
        self._bmc = bmc
        self._limit = limit
        self._rack = rack
        self._size = size

    async def power_state(self) -> PowerState:
        async with self._limit.slot(self._rack, self._size):
            return await self._bmc.power_state()

    async def set_power(self, state: PowerState, *, soft: bool = False) -> None:
        async with self._limit.slot(self._rack, self._size):
            await self._bmc.set_power(state, soft=soft)

    async def power_cycle(self) -> None:
        async with self._limit.slot(self._rack, self._size):
            await self._bmc.power_cycle()

    async def set_boot_device(self, device: BootDevice, *, persistent: bool = False,
                              uefi: bool = True, http_uri: str | None = None) -> None:
        async with self._limit.slot(self._rack, self._size):
            await self._bmc.set_boot_device(device, persistent=persistent, uefi=uefi,
                                            http_uri=http_uri)

    async def boot_device(self) -> BootSetting:
        async with self._limit.slot(self._rack, self._size):
            return await self._bmc.boot_device()

    async def aclose(self) -> None:
        await self._bmc.aclose()
