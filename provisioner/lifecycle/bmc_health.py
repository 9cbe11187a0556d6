"""The BMC health poll (issue 24's out-of-band source): every ``[health]
bmc_poll_interval_s``, each in-service node's BMC is read (``bmc_poll_concurrency`` at a
time, through the BMC manager's breaker, limiter and deadline, IPMI in the worker
processes): new SEL or Redfish log records, the system's ``Status.Health`` and the leak
detectors of a liquid-cooled chassis become findings through the same intake as the API
(``HealthFindings``: dedup, history, the repair ladder's hook), with origin ``bmc``.

Per node a cursor is kept in the store (``health_cursor``): the driver's log cursor (the
last record read) and the states last reported, so a restart or the next fleet leader
neither raises an old record again nor forgets to clear a state that went back to OK.
A node's first read sets its cursor and raises none of the records already there
(``health.bmc``). A BMC that fails is logged and tried again next sweep; one whose driver
reads no health (the simulation's) is skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from provisioner.bmc.base import BmcFactory, BmcHealth, BmcUnsupported, health_reader
from provisioner.config.health import HealthSettings
from provisioner.domain import BmcTarget
from provisioner.errors import DriverError
from provisioner.health.model import HealthClass
from provisioner.health.records import Origin, Report
from provisioner.lifecycle.health import OBSERVED_STATES, HealthFindings
from provisioner.store.repo import NodeRepo

log = logging.getLogger(__name__)

SOURCE: Final = "bmc"
ACTOR: Final = "bmc-health"


@dataclass
class HealthSweep:
    read: int = 0
    unchanged: int = 0
    reported: int = 0
    cleared: int = 0
    skipped: int = 0
    failed: int = 0
    baseline: int = 0
    seconds: float = 0.0
    errors: dict[str, str] = field(default_factory=dict)


class BmcHealthPoll:
    def __init__(self, repo: NodeRepo, health: HealthFindings, bmc: BmcFactory,
                 settings: HealthSettings, *,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._repo = repo
        self._health = health
        self._bmc = bmc
        self._settings = settings
        self._sleep = sleep

    async def run(self) -> None:
        """The daemon's task; returns at once when the interval is 0 (polling off)."""
        interval_s = self._settings.bmc_poll_interval_s
        if interval_s == 0:
            return
        while True:
            report = await self.sweep()
            log.info("bmc health: %d read (%d unchanged), %d findings reported, %d cleared, "
                     "%d skipped, %d failed in %.1f s", report.read, report.unchanged,
                     report.reported, report.cleared, report.skipped, report.failed,
                     report.seconds)
            await self._sleep(max(0.0, interval_s - report.seconds))

    async def sweep(self) -> HealthSweep:
        started = time.monotonic()
        report = HealthSweep()
        slots = asyncio.Semaphore(self._settings.bmc_poll_concurrency)
        cursors = await self._health.repo.cursors(SOURCE)

        async def one(node: BmcTarget) -> None:
            if node.state not in OBSERVED_STATES:
                report.skipped += 1
                return
            async with slots:
                await self._poll(node, cursors.get(node.id), report)

        # one read of the columns needed, credentials included (as the power sync does)
        await asyncio.gather(*(one(node) for node in await self._repo.bmc_targets()))
        report.seconds = time.monotonic() - started
        return report

    async def _poll(self, node: BmcTarget, stored: str | None, report: HealthSweep) -> None:
        handle = self._bmc(node.id, node.bmc, node.credentials)
        bmc = health_reader(handle)
        if bmc is None:
            report.skipped += 1
            return
        before = _load(stored)
        try:
            reading = await bmc.read_health(before.get("log"))
        except BmcUnsupported as exc:
            report.skipped += 1
            log.debug("bmc health: node %s: %s", node.id, exc)
            return
        except DriverError as exc:  # this task's boundary: log, try again next sweep
            report.failed += 1
            report.errors[node.id] = str(exc)
            log.warning("bmc health: node %s: %s", node.id, exc)
            return
        finally:
            await handle.aclose()
        report.read += 1
        report.baseline += reading.baseline
        states = await self._apply(node, reading, before, report)
        after = json.dumps({"log": reading.cursor, "states": states}, separators=(",", ":"))
        if after == stored:
            report.unchanged += 1
        else:
            await self._health.repo.set_cursor(node.id, SOURCE, after)

    async def _apply(self, node: BmcTarget, reading: BmcHealth, before: dict[str, Any],
                     report: HealthSweep) -> list[list[str]]:
        for event in reading.events:
            finding = event.finding
            if event.clears:
                if await self._health.resolve(node.id, Origin.BMC, finding.cls,
                                              Report.of(finding).clipped().subject,
                                              actor=ACTOR) is not None:
                    report.cleared += 1
            else:
                await self._health.report(node.id, Origin.BMC, [Report.of(finding)],
                                          actor=ACTOR)
                report.reported += 1
        now = [Report.of(f).clipped() for f in reading.states]
        if now:  # a state still wrong is seen again (last_seen), never opened twice
            await self._health.report(node.id, Origin.BMC, now, actor=ACTOR)
            report.reported += len(now)
        keys = sorted([str(r.cls), r.subject] for r in now)
        for cls, subject in before.get("states", ()):
            if [cls, subject] not in keys and await self._health.resolve(
                    node.id, Origin.BMC, HealthClass(cls), subject, actor=ACTOR) is not None:
                report.cleared += 1
        return keys


def _load(stored: str | None) -> dict[str, Any]:
    try:
        value = json.loads(stored) if stored else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
