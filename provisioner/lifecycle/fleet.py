"""One daemon among several on one database (DESIGN §7, docs/ha.md).

``FleetMember`` keeps this daemon's heartbeat and node leases fresh, takes over the in-flight
nodes of daemons that died or were cut off (their leases expired) and re-applies the policy
to nodes a dead daemon left waiting. ``Singleton`` runs fleet-wide work (topology
publication, power-state sync, Kubernetes and Slurm syncs, expiry sweeps) on the one daemon
that leads it, and moves it when that daemon stops renewing its lead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.periodic import every
from provisioner.store.ownership import OwnershipRepo

log = logging.getLogger(__name__)

Work = Callable[[], Coroutine[Any, Any, None]]


class FleetMember:
    def __init__(self, conductor: Conductor, ownership: OwnershipRepo, *, api_listen: str,
                 takeover_batch: int = 200) -> None:
        self._conductor = conductor
        self._own = ownership
        self._api_listen = api_listen
        self._batch = takeover_batch
        self.interval_s = ownership.lease_s / 3
        self._confirmed = time.monotonic()  # when the last renewal that the database took began

    async def beat(self) -> None:
        """One round of both loops (tests)."""
        await self.renew()
        await self.take_over()

    async def renew(self) -> None:
        began = time.monotonic()
        await self._own.heartbeat(self._api_listen)
        await self._conductor.renew_leases()
        self._confirmed = began

    async def guard(self) -> None:
        """Stand down when no renewal has been confirmed for two thirds of a lease (a
        database cut away, or a renewal hanging): the last third is the margin for calls
        already in flight to end before the leases can expire and be taken over."""
        if (unconfirmed := time.monotonic() - self._confirmed) >= self.interval_s * 2:
            self._conductor.stand_down(unconfirmed)

    async def take_over(self) -> None:
        taken = await self._conductor.take_over(limit=self._batch)
        if taken:
            log.warning("took over %d in-flight nodes whose daemon stopped renewing", taken)
        await self._conductor.apply_stale_policies(self._own.lease_s)

    async def run(self) -> None:
        """Renewal runs in its own loop: a slow take-over round never delays it; the guard
        in a third, so a renewal that hangs still stops our steps in time."""
        self._confirmed = time.monotonic()
        async with asyncio.TaskGroup() as group:
            group.create_task(every(self.interval_s, self.renew, "fleet: lease renewal"))
            group.create_task(every(self.interval_s, self.take_over, "fleet: take-over"))
            group.create_task(every(self.interval_s / 4, self.guard, "fleet: lease guard"))


class Singleton:
    """Run ``works`` while this daemon leads ``name``; stop them when the lead is lost or
    cannot be renewed before it would expire."""

    def __init__(self, ownership: OwnershipRepo, name: str, works: Sequence[tuple[str, Work]]):
        self._own = ownership
        self._name = name
        self._works = tuple(works)
        self._tasks: list[asyncio.Task[None]] = []
        self.fence: int | None = None

    @property
    def leading(self) -> bool:
        return bool(self._tasks)

    async def run(self) -> None:
        interval = self._own.lease_s / 3
        confirmed = 0.0
        try:
            while True:
                try:
                    fence = await self._own.lead(self._name)
                    if fence is not None:
                        confirmed = time.monotonic()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # database away: lead only while surely ours
                    log.warning("singleton %s: lead not renewed: %s", self._name,
                                type(exc).__name__)
                    fence = self.fence if time.monotonic() - confirmed < interval * 2 else None
                if fence is not None and not self._tasks:
                    log.info("singleton %s: this daemon (%s) leads it now (fence %d)",
                                self._name, self._own.instance, fence)
                    self._tasks = [asyncio.create_task(work(), name=f"{self._name}:{label}")
                                   for label, work in self._works]
                elif fence is None and self._tasks:
                    log.warning("singleton %s: lead lost; stopping its work", self._name)
                    await self._stop()
                self.fence = fence
                await asyncio.sleep(interval)
        finally:
            await self._stop()

    async def _stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
