"""DHCP beyond one core: the daemon's loop and ``dhcp.workers`` processes
(``dhcp_worker.py``) answer the server port, each on its own ``SO_REUSEPORT`` socket,
requests steered by the client's hardware address (``reuseport.py``; a relay's requests all
come from one address), each handing new clients addresses from its own part of the pool
(the loop the first). This is the daemon's side: it binds the group, answers the first
socket in its own ``DhcpServer``, starts the workers on the others (``worker_group.py``),
passes on the unknown MACs that booted (enrolment stays the conductor's), and tells the
workers which MACs' nodes changed, with the node as the conductor wrote it when it has it
(each keeps the answers to "whose MAC is this?"; a MAC told without a node it asks the
store).

Only authoritative mode runs in workers (proxy mode writes nothing and answers two
ports: it stays in the daemon's loop).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import Any, Protocol

from provisioner.boot.dhcp import DhcpServer
from provisioner.boot.inventory import BootInventory, UnknownReports
from provisioner.boot.reuseport import reuseport_group
from provisioner.boot.worker_group import Worker, WorkerGroup
from provisioner.config import BootSettings, DhcpSettings
from provisioner.domain import MacChanges
from provisioner.store.leases import AddressRange, LeaseRepo

log = logging.getLogger(__name__)

_MACS_A_MESSAGE = 2000  # ~40 KB of JSON: inside a control message (MAX_MESSAGE)
_NODES_A_MESSAGE = 150  # [mac, node id, hostname, state]: at most ~400 bytes each
DEFAULT_MAX_WORKERS = 4  # each holds a store connection; SQLite takes one writer at once
MAX_REPORTING = 1024  # unknown MACs being enrolled at once (as DhcpServer's own bound)


def worker_count(settings: DhcpSettings) -> int:
    """How many processes answer DHCP beside the daemon's loop (0: the loop alone).
    ``dhcp.workers``, by default one per CPU this process may run on less the one the
    daemon's loop needs (as TFTP's), at most ``DEFAULT_MAX_WORKERS``: on 2 CPUs the loop and
    one process. There two processes with the loop left out answered as many leases a
    second under perfdhcp, but a 1,000-client PXE storm, where the loop also serves TFTP,
    HTTP and the enrolments, finished later with them; the loop alone answered half as
    many (docs/performance.md "DHCP"). Never more answerers than the pool's addresses (a
    part each); proxy mode always answers in the loop alone."""
    if settings.mode != "authoritative":
        return 0
    wanted = settings.workers if settings.workers is not None else max(
        0, min(len(os.sched_getaffinity(0)) - 1, DEFAULT_MAX_WORKERS))
    if settings.pool is not None:  # each answerer needs a part of the pool of its own
        wanted = min(wanted, len(AddressRange.parse(settings.pool, settings.netmask)) - 1)
    return wanted


class ChangeFeed(Protocol):
    """Who tells which MACs' owners changed (``lifecycle.discovery.Discovery``)."""

    def add_listener(self, listener: Callable[[MacChanges | None], None]) -> None: ...


class DhcpWorkers(WorkerGroup):
    module = "provisioner.boot.dhcp_worker"
    kind = "DHCP"

    def __init__(self, listening: list[socket.socket], *, init: dict[str, Any],
                 inventory: BootInventory) -> None:
        """``init``: what every worker is told first (``dhcp_worker.py``). Worker ``k``
        answers part ``k + 1`` of the pool: part 0 is the daemon's loop's."""
        super().__init__(listening)
        self._init = init
        self._unknown = UnknownReports(inventory, MAX_REPORTING)
        self._changed: MacChanges = {}
        self._everything = False
        self._flushing = False

    def arguments(self, slot: int) -> list[str]:
        return ["--slot", str(slot + 1), "--count", str(len(self._listening) + 1)]

    def started(self, worker: Worker) -> None:
        self.send(worker, {"init": self._init})

    def received(self, worker: Worker, message: dict[str, Any]) -> None:
        if (isinstance(unknown := message.get("unknown"), list) and len(unknown) == 2
                and all(isinstance(x, str) for x in unknown)):
            self._unknown.report(unknown[0], unknown[1])
        else:
            log.warning("DHCP: worker %d sent an unknown message", worker.slot)

    def changed(self, changes: MacChanges | None) -> None:
        """What the workers answer for these MACs changed (None: for any MAC): told to
        every worker once this turn of the loop is over, the latest for each MAC (a storm's
        transitions, thousands a second, in a few messages)."""
        if changes is None:
            self._everything = True
        else:
            self._changed.update(changes)
        self._flush_soon(0.0)

    def _flush_soon(self, delay_s: float) -> None:
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_later(delay_s, self._flush)

    def _flush(self) -> None:
        self._flushing = False
        changes, self._changed = self._changed, {}
        everything, self._everything = self._everything, False
        messages: list[dict[str, Any]] = [{"forget": None}] if everything else \
            _messages(changes)
        for worker in self.running():
            if not all(self.send(worker, message) for message in messages):
                # its buffer is full: it forgets everything it knows, once it can be told
                self._everything = True
                self._flush_soon(0.1)

    async def stop(self) -> None:
        await super().stop()
        await self._unknown.stop()


def _messages(changes: MacChanges) -> list[dict[str, Any]]:
    """``{"forget": [mac, …]}`` (ask the store) and ``{"known": [[mac, node id, hostname,
    state], …]}`` (answer this), in chunks that fit a control message."""
    forget = sorted(mac for mac, known in changes.items() if known is None)
    known = [[mac, node.node_id, node.hostname, node.state]
             for mac, node in sorted(changes.items()) if node is not None]
    return [{"forget": forget[i:i + _MACS_A_MESSAGE]}
            for i in range(0, len(forget), _MACS_A_MESSAGE)] + \
           [{"known": known[i:i + _NODES_A_MESSAGE]}
            for i in range(0, len(known), _NODES_A_MESSAGE)]


class DhcpProcesses:
    """The boot stack's DHCP server when ``dhcp.workers`` > 0 (authoritative mode): the
    daemon's loop (with ``leases``, the daemon's own lease repository) and ``count`` worker
    processes, each a member of the port's reuseport group answering its part of the
    pool."""

    def __init__(self, settings: DhcpSettings, boot: BootSettings, *, http_base_url: str,
                 database_url: str, inventory: BootInventory, changes: ChangeFeed | None,
                 count: int, leases: LeaseRepo) -> None:
        self._settings = settings
        self._boot = boot
        self._http_base_url = http_base_url
        self._init = {"dhcp": settings.model_dump(mode="json"),
                      "boot": boot.model_dump(mode="json"),
                      "http_base_url": http_base_url, "database_url": database_url}
        self._inventory = inventory
        self._changes = changes
        self._count = count
        self._leases = leases
        self._loop: DhcpServer | None = None
        self._workers: DhcpWorkers | None = None

    @property
    def workers(self) -> DhcpWorkers | None:
        return self._workers

    async def start(self) -> None:
        parts = self._count + 1
        group = reuseport_group("0.0.0.0", self._settings.port, parts, by="chaddr",
                                interface=self._settings.interface, broadcast=True)
        loop = DhcpServer(self._settings, self._boot, http_base_url=self._http_base_url,
                          inventory=self._inventory, leases=self._leases, part=(0, parts))
        loop.serve_on(group[0])  # closed by its stop
        self._loop = loop
        workers = DhcpWorkers(group[1:], init=self._init, inventory=self._inventory)
        if self._changes is not None:
            self._changes.add_listener(workers.changed)
        try:
            await workers.start()
        except BaseException:
            await self.stop()
            raise
        self._workers = workers
        log.info("DHCP authoritative on %s port %d (server id %s): the daemon's loop and %d "
                 "worker processes", self._settings.interface or "all interfaces",
                 self._settings.port, self._settings.server_address, self._count)

    async def stop(self) -> None:
        if self._workers is not None:
            await self._workers.stop()
            self._workers = None
        if self._loop is not None:
            await self._loop.stop()
            self._loop = None
