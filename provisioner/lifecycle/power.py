"""Power outside the steps: operators' power and boot-device requests (through
``Conductor.power`` / ``Conductor.set_boot_device``) and the periodic power-state sync,
which records out-of-band changes in the history without fighting an in-flight step."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from provisioner.bmc.base import (
    Bmc,
    BmcFactory,
    PowerAction,
    PowerState,
    SoftOff,
    ensure_soft_off,
)
from provisioner.config import BmcSettings
from provisioner.domain import BmcTarget
from provisioner.errors import DriverError
from provisioner.lifecycle.states import IN_FLIGHT
from provisioner.store.repo import NodeRepo

log = logging.getLogger(__name__)

SYNC_ACTOR = "power-sync"


_DEFAULT_SOFT_OFF = SoftOff()


async def apply_power(bmc: Bmc, action: PowerAction, *,
                      soft_off: SoftOff = _DEFAULT_SOFT_OFF) -> PowerState:
    """Carry out ``action``; return the power state it leaves (read for ``status``).
    ``soft_off``: how long a soft-off may take, and whether a hard off may follow."""
    if action is PowerAction.STATUS:
        return await bmc.power_state()
    if action is PowerAction.CYCLE:
        await bmc.power_cycle()
        return PowerState.ON
    if action is PowerAction.SOFT_OFF:
        await ensure_soft_off(bmc, soft_off)
        return PowerState.OFF
    want = PowerState.ON if action is PowerAction.ON else PowerState.OFF
    await bmc.set_power(want)
    return want


class RecordPower(Protocol):
    """``Conductor.record_power`` with its default actor: the state read, and the recorded
    state it was read against (``""``: none; a reading older than a state recorded since is
    dropped)."""

    def __call__(self, node_id: str, state: str, *,
                 against: str | None = None) -> Awaitable[object]: ...


@dataclass
class SweepReport:
    read: int = 0
    changed: int = 0
    skipped: int = 0
    failed: int = 0


class PowerSync:
    """Every ``power_sync_interval_s``, read each idle node's power through its BMC
    (``power_sync_concurrency`` at a time) and hand differences to ``record``."""

    def __init__(self, repo: NodeRepo, bmc: BmcFactory, record: RecordPower,
                 settings: BmcSettings, *,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._repo = repo
        self._bmc = bmc
        self._record = record
        self._settings = settings
        self._sleep = sleep

    async def run(self) -> None:
        """The daemon's task; returns at once when the interval is 0 (sync disabled)."""
        interval_s = self._settings.power_sync_interval_s
        if interval_s == 0:
            return
        while True:
            report = await self.sweep()
            log.info("power sync: %d read, %d changed out of band, %d in flight, %d failed",
                     report.read, report.changed, report.skipped, report.failed)
            await self._sleep(interval_s)

    async def sweep(self) -> SweepReport:
        report = SweepReport()
        slots = asyncio.Semaphore(self._settings.power_sync_concurrency)

        async def one(node: BmcTarget) -> None:
            if node.state in IN_FLIGHT:
                report.skipped += 1  # its step owns the power
                return
            async with slots:
                state = await self._read(node)
            if state is None:
                report.failed += 1
                return
            report.read += 1
            changed = str(state) != node.power_state
            if changed and await self._record(node.id, str(state),
                                              against=node.power_state or "") is not None:
                report.changed += 1

        # nodes and credentials in one read; no write unless a state differs
        await asyncio.gather(*(one(node) for node in await self._repo.bmc_targets()))
        return report

    async def _read(self, node: BmcTarget) -> PowerState | None:
        bmc = self._bmc(node.id, node.bmc, node.credentials)
        try:
            return await bmc.power_state()
        except DriverError as exc:  # this task's boundary: log once, try again next sweep
            log.warning("power sync: node %s: %s", node.id, exc)
            return None
        finally:
            await bmc.aclose()
