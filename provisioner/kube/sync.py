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
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
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
    NodeWatch,
)

log = logging.getLogger(__name__)
OnChange = Callable[[str, bool, str], Awaitable[None]]
OnFindings = Callable[[dict[str, list[Report]]], Awaitable[object]]
SLINKY_CORDON_REASON = "nodeset.slinky.slurm.net/node-cordon-reason"


class NodeWatcher(Protocol):
    async def list_nodes_at(self, label_selector: str | None = None
                            ) -> tuple[list[NodeInfo], str]: ...

    async def watch_nodes(self, label_selector: str | None, resource_version: str, *,
                          timeout_s: int) -> NodeWatch: ...


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


def _unsettled(info: NodeInfo) -> bool:
    """Whether the node's verdict can change with time alone (``Ready`` not ``True``: past
    the grace period it becomes maintenance, and its reports count the seconds down)."""
    cond = info.condition("Ready")
    return cond is not None and cond.status != "True"


class KubeSync:
    """Lists the daemon's Nodes once, then follows them with a watch (an informer's cache):
    at rest, a pass costs the Nodes that changed, not the fleet. Each pass (at most every
    ``interval_s``, the length of each watch) judges the nodes that changed and those whose
    verdict runs on a clock; a watch that cannot go on (410 Gone, an error) lists again."""

    def __init__(self, client: NodeWatcher, on_change: OnChange, *, grace_s: float,
                 interval_s: float, on_findings: OnFindings | None = None,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._on_change = on_change
        self._on_findings = on_findings
        self._grace_s = grace_s
        self._interval_s = interval_s
        self._now = now
        self._sleep = sleep
        self._clock = clock
        self._reported: dict[str, str | None] = {}  # hostname → last reported reason
        self._nodes: dict[str, NodeInfo] = {}  # hostname → the Node as last seen
        self._reports: dict[str, list[Report]] = {}  # hostname → its health reports
        self._dirty: set[str] = set()  # changed since the last pass
        self._unsettled: set[str] = set()  # judged again every pass (``_unsettled``)
        self.lists = 0  # full lists so far (the first, then one per lost watch)

    async def run(self) -> None:
        """Sync forever (a TaskGroup child of the daemon); a failed pass is logged and the
        Nodes are listed again after ``interval_s``."""
        version: str | None = None
        while True:
            began = self._clock()
            try:
                if version is None:
                    version = await self._relist()
                    continue  # straight into the watch
                version = await self._follow(version)
            except ProvisionerError as exc:
                log.warning("kube sync: %s", exc)
                version = None
                await self._sleep(self._interval_s)
                continue
            left = self._interval_s - (self._clock() - began)
            if left > 0:  # a watch that ended early (or expired) does not spin
                await self._sleep(left)

    async def sync_once(self) -> None:
        """List every Node and judge them (what ``run`` does first, and after a lost watch)."""
        await self._relist()

    async def _relist(self) -> str:
        infos, version = await self._client.list_nodes_at(label_selector=LABEL_NODE_ID)
        self.lists += 1
        listed = {info.name: info for info in infos}
        for name in [name for name in self._nodes if name not in listed]:
            self._forget(name)
        for info in infos:
            self._note(info)
        await self._judge()
        return version

    async def _follow(self, version: str) -> str | None:
        """One watch of ``interval_s`` from ``version``, then a pass; the version to go on
        from, or None when the watch cannot go on (list again)."""
        watch = await self._client.watch_nodes(LABEL_NODE_ID, version,
                                               timeout_s=max(1, round(self._interval_s)))
        for kind, info in watch.events:
            if kind == "DELETED":
                self._forget(info.name)
            else:
                self._note(info)
        await self._judge()
        if watch.expired:
            log.info("kube sync: the watch of Nodes expired at version %s; listing again",
                     version)
            return None
        return watch.resource_version

    def _note(self, info: NodeInfo) -> None:
        old = self._nodes.get(info.name)
        if old is None or replace(info, resource_version=old.resource_version) != old:
            self._dirty.add(info.name)  # a heartbeat alone changes only the version
        self._nodes[info.name] = info
        if _unsettled(info):
            self._unsettled.add(info.name)
        else:
            self._unsettled.discard(info.name)

    def _forget(self, name: str) -> None:
        self._nodes.pop(name, None)
        self._reports.pop(name, None)
        self._dirty.discard(name)
        self._unsettled.discard(name)

    async def _judge(self) -> None:
        now = self._now()
        names = sorted(self._dirty | self._unsettled)
        self._dirty.clear()
        for name in names:
            self._reports[name] = health_reports(self._nodes[name], now, self._grace_s)
        if self._on_findings is not None:
            await self._on_findings(dict(self._reports))
        for name in names:
            info = self._nodes[name]
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
