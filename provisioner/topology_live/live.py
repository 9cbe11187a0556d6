"""The live fleet topology: recomputed from the store when nodes join or leave (a conductor
observer), when a fabric scan arrives, and periodically as a safety net; published to each
sink only when what it would publish changed (``Snapshot.digest``).

Membership: nodes with a hostname in ``MEMBER_STATES`` (the OS is up and the node is, or is
about to be, in Slurm). Inputs are cached between recomputes: fabric scans by their sha256,
nodes' GPU reports by the node row's version, so a recompute of a large fleet reads the
(large) facts only of nodes that changed. The graph is built on a one-thread "topology"
pool (parsing a big fabric takes tens of milliseconds: not on the loop).

Each publisher remembers the digest it last published completely. A failed or incomplete
publication (a Node not yet in Kubernetes, a reload command that failed) is retried at the
next recompute, with the same digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Protocol

from provisioner.config import TopologySettings
from provisioner.domain import Node, NodeState
from provisioner.store.topology import TopologyRepo
from provisioner.topology.model import Finding, GpuReport, IbScan
from provisioner.topology.snapshot import (
    Snapshot,
    build_snapshot,
    read_fabric,
    read_gpu_report,
)

log = logging.getLogger(__name__)

#: states of a node that belongs in the published topology (validating: issue 7's gate)
MEMBER_STATES: Final = frozenset({"joining", "validating", "registering", "active"})
#: history events that change an input without a state change
INPUT_EVENTS: Final = frozenset({"fabric_reported", "facts_reported", "adopt"})


class Publisher(Protocol):
    name: str

    async def publish(self, snapshot: Snapshot) -> bool:
        """Write what differs; True when complete, False to be retried (nothing failed)."""


@dataclass(frozen=True, slots=True)
class PublishStatus:
    digest: str | None = None     # the digest last published completely
    at: datetime | None = None
    error: str = ""               # the last attempt's failure, "" when it succeeded
    pending: bool = False         # the current digest is not (completely) published


@dataclass(frozen=True, slots=True)
class FabricInfo:
    name: str
    sha256: str
    reporter_node_id: str | None
    received_at: datetime


@dataclass(frozen=True, slots=True)
class LiveView:
    snapshot: Snapshot
    computed_at: datetime
    fabrics: tuple[FabricInfo, ...]
    members: tuple[str, ...]
    publishers: Mapping[str, PublishStatus] = field(default_factory=dict)


@dataclass
class _Inputs:
    """Parsed inputs, cached across recomputes."""

    scans: dict[str, tuple[str, IbScan | Finding]] = field(default_factory=dict)
    reports: dict[str, tuple[str, str, GpuReport | Finding | None]] = field(
        default_factory=dict)   # node id -> (version, hostname, report)
    parsed: dict[str, tuple[str, GpuReport | Finding]] = field(
        default_factory=dict)   # node id -> (sha256 of hostname + XML, parsed)


class LiveTopology:
    def __init__(self, repo: TopologyRepo, settings: TopologySettings,
                 publishers: Sequence[Publisher] = (), *, executor: Executor | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._repo = repo
        self._settings = settings
        self._publishers = tuple(publishers)
        self._own_pool = executor is None
        self._pool = executor or ThreadPoolExecutor(1, thread_name_prefix="topology")
        self._clock = clock
        self._dirty = asyncio.Event()
        self._lock = asyncio.Lock()
        self._inputs = _Inputs()
        self._view: LiveView | None = None
        self._status: dict[str, PublishStatus] = {p.name: PublishStatus()
                                                  for p in self._publishers}
        self._held: Callable[[], Awaitable[set[str]]] | None = None

    def hold_with(self, held: Callable[[], Awaitable[set[str]]]) -> None:
        """``held``: hostnames left out of the topology although their state is a member's
        (an active NVLink domain held by a failed fabric acceptance: its block shrinks)."""
        self._held = held

    # -- inputs -------------------------------------------------------------------------------

    def observe(self, node: Node, event: str, before: NodeState) -> None:
        """Conductor observer: a member's transition (a join, a leave, or a step that may
        have made its Node appear), or an input changed. Cheap: it only marks the topology
        for a (debounced) recompute, which writes nothing when the digest is unchanged."""
        if str(node.state) in MEMBER_STATES or str(before) in MEMBER_STATES \
                or event in INPUT_EVENTS:
            self._dirty.set()

    def invalidate(self) -> None:
        self._dirty.set()

    # -- reads --------------------------------------------------------------------------------

    def spec_for(self, hostname: str) -> str | None:
        """The node's ``topology.slinky.slurm.net/spec`` in the last computed topology."""
        view = self._view
        return view.snapshot.annotations.get(hostname) if view is not None else None

    async def current_spec(self, hostname: str) -> str | None:
        """``spec_for`` after a recompute if a join or leave is not reflected yet."""
        if self._view is None or self._dirty.is_set():
            await self.refresh()
        return self.spec_for(hostname)

    async def view(self) -> LiveView:
        """The last computed topology (computed now if none was); publication statuses."""
        view = self._view if self._view is not None else await self.refresh(publish=False)
        return LiveView(view.snapshot, view.computed_at, view.fabrics, view.members,
                        dict(self._status))

    # -- recompute and publish ----------------------------------------------------------------

    async def refresh(self, *, publish: bool = True) -> LiveView:
        """Recompute from the store; publish to every sink whose digest differs."""
        async with self._lock:
            self._dirty.clear()
            view = await self._compute()
            self._view = view
            if publish:
                await self._publish(view.snapshot)
            return view

    async def run(self) -> None:
        """Recompute at start, after each join/leave (debounced) and every interval."""
        settings = self._settings
        self._dirty.set()
        while True:
            try:
                async with asyncio.timeout(settings.recompute_interval_s or None):
                    await self._dirty.wait()
                await asyncio.sleep(settings.debounce_s)   # let a rack's joins coalesce
            except TimeoutError:
                pass
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop's task boundary: log, keep the last topology
                log.exception("topology: recompute failed")
                await asyncio.sleep(settings.debounce_s or 1.0)

    async def aclose(self) -> None:
        if self._own_pool:
            self._pool.shutdown(wait=False)

    async def _compute(self) -> LiveView:
        fabrics = await self._read_fabrics()
        members = await self._read_members()
        scans = [v for _, v in self._inputs.scans.values() if isinstance(v, IbScan)]
        reports = [r for _, host, r in self._inputs.reports.values()
                   if isinstance(r, GpuReport) and host in members]  # held: left out
        findings = [v for _, v in self._inputs.scans.values() if isinstance(v, Finding)]
        findings += [r for _, _, r in self._inputs.reports.values() if isinstance(r, Finding)]
        settings = self._settings
        snapshot = await asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: build_snapshot(
                scans, members, reports, kind=settings.format,
                block_size=settings.block_size or None, findings=findings))
        return LiveView(snapshot, self._clock(), fabrics, tuple(sorted(members)))

    async def _read_fabrics(self) -> tuple[FabricInfo, ...]:
        digests = await self._repo.digests()
        cache = self._inputs.scans
        for name in [n for n in cache if n not in digests]:
            del cache[name]
        if any(cache.get(name, ("",))[0] != digest for name, digest in digests.items()):
            loop = asyncio.get_running_loop()
            for scan in await self._repo.all():
                if cache.get(scan.name, ("",))[0] != scan.sha256:
                    parsed = await loop.run_in_executor(
                        self._pool, read_fabric, scan.name, scan.text)
                    cache[scan.name] = (scan.sha256, parsed)
        infos = await self._repo.infos()
        return tuple(FabricInfo(i.name, i.sha256, i.reporter_node_id, i.received_at)
                     for i in infos)

    async def _read_members(self) -> set[str]:
        rows = await self._repo.members(MEMBER_STATES)
        cache = self._inputs.reports
        current = {row.node_id for row in rows}
        for node_id in [n for n in cache if n not in current]:
            del cache[node_id]
        for node_id in [n for n in self._inputs.parsed if n not in current]:
            del self._inputs.parsed[node_id]
        stale = [row for row in rows if cache.get(row.node_id, ("",))[0] != row.version]
        if stale:
            xmls = await self._repo.gpu_xml(row.node_id for row in stale)
            for row in stale:
                xml = xmls.get(row.node_id)
                report = await self._gpu_report(row.node_id, row.hostname, xml)
                cache[row.node_id] = (row.version, row.hostname, report)
        held = await self._held() if self._held is not None else set()
        return {row.hostname for row in rows} - held

    async def _gpu_report(self, node_id: str, hostname: str,
                          xml: str | None) -> GpuReport | Finding | None:
        """The parsed XML; parsed again only when the XML changed (a member's row changes
        with every checkpoint, its XML rarely)."""
        if xml is None:
            self._inputs.parsed.pop(node_id, None)
            return None
        digest = hashlib.sha256(f"{hostname}\0{xml}".encode()).hexdigest()
        known = self._inputs.parsed.get(node_id)
        if known is not None and known[0] == digest:
            return known[1]
        report = await asyncio.get_running_loop().run_in_executor(
            self._pool, read_gpu_report, hostname, xml)
        self._inputs.parsed[node_id] = (digest, report)
        return report

    async def _publish(self, snapshot: Snapshot) -> None:
        for publisher in self._publishers:
            status = self._status[publisher.name]
            if status.digest == snapshot.digest and not status.pending:
                continue
            try:
                complete = await publisher.publish(snapshot)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a sink's failure must not stop the others
                log.warning("topology: publishing to %s failed: %s", publisher.name, exc)
                self._status[publisher.name] = PublishStatus(
                    status.digest, status.at, error=str(exc) or type(exc).__name__,
                    pending=True)
                continue
            self._status[publisher.name] = PublishStatus(
                snapshot.digest if complete else status.digest,
                self._clock() if complete else status.at, pending=not complete)
            if complete and status.digest != snapshot.digest:
                log.info("topology: published %s to %s", snapshot.digest[:12], publisher.name)

