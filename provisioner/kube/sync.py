"""Kubernetes → daemon: a node someone else cordoned, or one ``NotReady`` for longer than the
grace period, is reported through ``on_change(hostname, maintenance, reason)``.

Edge-triggered: each change is reported once; a node seen healthy at the first pass is not
reported. Only Nodes carrying ``provisioner.io/node-id`` (the daemon's) are considered.

Each pass also hands what it read to ``on_findings`` as health reports (``Ready`` not
``True``, node-problem-detector's conditions, allocatable ``nvidia.com/gpu`` below the
node's ``nvidia.com/gpu.count``: ``health/sources.py``); the receiver writes only changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Protocol

from provisioner.errors import ProvisionerError
from provisioner.health.records import Report
from provisioner.health.sources import kube_reports
from provisioner.kube.model import (
    ANNOTATION_CORDON,
    LABEL_GPU_COUNT,
    LABEL_NODE_ID,
    RESOURCE_GPU,
    NodeInfo,
)

log = logging.getLogger(__name__)
OnChange = Callable[[str, bool, str], Awaitable[None]]
OnFindings = Callable[[dict[str, list[Report]]], Awaitable[object]]
SLINKY_CORDON_REASON = "nodeset.slinky.slurm.net/node-cordon-reason"


class NodeLister(Protocol):
    async def list_nodes(self, label_selector: str | None = None) -> list[NodeInfo]: ...


def maintenance_reason(info: NodeInfo, now: datetime, grace_s: float) -> str | None:
    """Why the node needs maintenance according to Kubernetes, or None (pure)."""
    if info.unschedulable and ANNOTATION_CORDON not in info.annotations:
        why = info.annotations.get(SLINKY_CORDON_REASON, "")
        return "cordoned in Kubernetes" + (f": {why}" if why else "")
    cond = info.condition("Ready")
    if cond is not None and cond.status != "True" and cond.last_transition is not None:
        down_s = (now - cond.last_transition).total_seconds()
        if down_s > grace_s:
            detail = f", {cond.reason}" if cond.reason else ""
            return f"Ready={cond.status} for {down_s:.0f} s{detail}"
    return None


def health_reports(info: NodeInfo, now: datetime, grace_s: float) -> list[Report]:
    """What the Node says of the machine's health (pure)."""
    conditions = [(c.type, c.status, c.reason, c.message, c.last_transition)
                  for c in info.conditions]
    return kube_reports(conditions, now=now, grace_s=grace_s,
                        allocatable_gpus=_count(info.allocatable.get(RESOURCE_GPU)),
                        gpu_count=_count(info.labels.get(LABEL_GPU_COUNT)))


def _count(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


class KubeSync:
    def __init__(self, client: NodeLister, on_change: OnChange, *, grace_s: float,
                 interval_s: float, on_findings: OnFindings | None = None,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._client = client
        self._on_change = on_change
        self._on_findings = on_findings
        self._grace_s = grace_s
        self._interval_s = interval_s
        self._now = now
        self._sleep = sleep
        self._reported: dict[str, str | None] = {}  # hostname → last reported reason

    async def run(self) -> None:
        """Sync forever (a TaskGroup child of the daemon); a failed pass is logged and retried."""
        while True:
            try:
                await self.sync_once()
            except ProvisionerError as exc:
                log.warning("kube sync: %s", exc)
            await self._sleep(self._interval_s)

    async def sync_once(self) -> None:
        now = self._now()
        infos = await self._client.list_nodes(label_selector=LABEL_NODE_ID)
        if self._on_findings is not None:
            await self._on_findings({info.name: health_reports(info, now, self._grace_s)
                                     for info in infos})
        for info in infos:
            reason = maintenance_reason(info, now, self._grace_s)
            first = info.name not in self._reported
            previous = self._reported.get(info.name)
            if reason == previous or (first and reason is None):
                self._reported[info.name] = reason
                continue
            if reason is not None and previous is not None:
                self._reported[info.name] = reason  # still in maintenance, reason refined
                continue
            log.info("kube sync: node %s maintenance=%s (%s)", info.name, reason is not None,
                     reason or previous)
            await self._on_change(info.name, reason is not None,
                                  reason or f"recovered in Kubernetes (was: {previous})")
            self._reported[info.name] = reason
