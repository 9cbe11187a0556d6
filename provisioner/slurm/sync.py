"""Slurm → daemon: a node drained in Slurm by someone else is reported through
``on_change(hostname, maintenance, reason)`` with Slurm's reason, and again when it is resumed.

Drains whose reason starts with our prefix (``provisioner: ``) are the daemon's own; those
starting ``slurm-operator:`` are Slinky mirroring a Kubernetes cordon, which kube/sync.py
already reports. Edge-triggered like ``KubeSync``: each change is reported once, and a node
seen undrained at the first pass is not reported.

Each pass also hands what it read to ``on_findings`` as health reports (``DOWN``,
``NOT_RESPONDING``, a drain by someone else, with its reason: ``health/sources.py``), every
node every pass: the receiver writes only what changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from provisioner.errors import ProvisionerError
from provisioner.health.records import Report
from provisioner.health.sources import slurm_reports
from provisioner.slurm.handoff import SLINKY_REASON_PREFIX
from provisioner.slurm.model import SlurmClient, SlurmNode

log = logging.getLogger(__name__)
OnChange = Callable[[str, bool, str], Awaitable[None]]
OnFindings = Callable[[dict[str, list[Report]]], Awaitable[object]]


def foreign_drain(node: SlurmNode, own_prefixes: tuple[str, ...]) -> str | None:
    """The reason of a drain someone else made, or None (pure)."""
    if not node.draining or node.reason.startswith(own_prefixes):
        return None
    who = f" by {node.reason_user}" if node.reason_user else ""
    return f"drained in Slurm{who}: {node.reason or 'no reason given'}"


class SlurmSync:
    def __init__(self, slurm: SlurmClient, on_change: OnChange, *, interval_s: float,
                 reason_prefix: str, on_findings: OnFindings | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._slurm = slurm
        self._on_change = on_change
        self._on_findings = on_findings
        self._interval_s = interval_s
        self._own = (reason_prefix, SLINKY_REASON_PREFIX)
        self._sleep = sleep
        self._reported: dict[str, str | None] = {}  # node name → last reported reason

    async def run(self) -> None:
        """Sync forever (a TaskGroup child of the daemon); a failed pass is logged and retried."""
        while True:
            try:
                await self.sync_once()
            except ProvisionerError as exc:
                log.warning("slurm sync: %s", exc)
            await self._sleep(self._interval_s)

    async def sync_once(self) -> None:
        nodes = await self._slurm.nodes()
        if self._on_findings is not None:
            await self._on_findings({
                node.name: slurm_reports(node.state, node.flags, node.reason,
                                         node.reason_user, self._own) for node in nodes})
        for node in nodes:
            reason = foreign_drain(node, self._own)
            first = node.name not in self._reported
            previous = self._reported.get(node.name)
            if reason == previous or (first and reason is None):
                self._reported[node.name] = reason
                continue
            if reason is not None and previous is not None:
                self._reported[node.name] = reason  # still drained, reason changed
                continue
            log.info("slurm sync: node %s maintenance=%s (%s)", node.name, reason is not None,
                     reason or previous)
            await self._on_change(node.name, reason is not None,
                                  reason or f"resumed in Slurm (was: {previous})")
            self._reported[node.name] = reason
