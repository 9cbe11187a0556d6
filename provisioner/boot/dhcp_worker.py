"""A DHCP worker process: answers the requests that reach its own listening socket, one of
the daemon's ``SO_REUSEPORT`` group steered by ``chaddr`` (``reuseport.py``), so that every
request of one client reaches the same worker (its offer, held in this process's memory,
and its per-MAC limits live here).

Run as ``python -m provisioner.boot.dhcp_worker --control FD --listen FD --slot K
--count N ...`` by ``dhcp_workers.py``. The first message on the control socket
(``worker_channel.py``) is ``{"init": {...}}``: the DHCP and boot settings, the boot HTTP
URL and the store's URL (never on the command line, which every local user can read).
The worker then runs the daemon's own ``DhcpServer`` with a lease repository of its own
on the same store: new clients get addresses from its part of the pool only (two
workers' offers never name one address), and the store's unique address decides every
bind, as between two daemons. Which node owns a MAC it is told by the daemon as the
conductor writes the node (``{"known": [[mac, node id, hostname, state], …]}``), or reads
in the store (one read for a burst's questions) when the daemon says only that the MAC
changed (``{"forget": [macs] | null}``: another daemon wrote it, say), keeping each answer
for ``ANSWER_TTL_S`` at most; an unknown network-booting MAC is reported to the daemon
(``{"unknown": [mac, client]}``): enrolment is the conductor's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from provisioner.boot.dhcp import DhcpServer
from provisioner.boot.worker_channel import Channel, attach, log_to, watch, worker_parser
from provisioner.config import BootSettings, DhcpSettings
from provisioner.domain import KnownNode
from provisioner.gc_tuning import tune_gc
from provisioner.ids import normalize_mac
from provisioner.store import db
from provisioner.store.leases import LeaseRepo
from provisioner.store.mac_lookup import MacLookup

log = logging.getLogger(__name__)

ANSWER_TTL_S = 30.0  # as the daemon's own unknown-MAC cache (lifecycle/discovery.py)
MAX_ANSWERS = 100_000
OFFER_SWEEP_S = 60.0


class WorkerInventory:
    """``BootInventory`` in a worker: which node owns a MAC, as the daemon told it
    (``learn``) or the store says (one read for a burst's questions, ``MacLookup``), kept
    until the daemon says the MAC changed or for ``ANSWER_TTL_S``; an unknown MAC that
    booted goes to the daemon."""

    def __init__(self, macs: MacLookup, send: Callable[[dict[str, Any]], None], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._macs = macs
        self._send = send
        self._clock = clock
        self._answers: dict[str, tuple[KnownNode | None, float]] = {}
        self._asking: dict[str, int] = {}  # MAC -> questions out now
        self._stale: set[str] = set()  # changed while a question was out: not kept

    async def lookup(self, mac: str) -> KnownNode | None:
        answer = self._answers.get(mac)
        if answer is not None and answer[1] > self._clock():
            return answer[0]
        self._asking[mac] = self._asking.get(mac, 0) + 1
        try:
            owner = await self._macs.owner(normalize_mac(mac))
        finally:
            if (left := self._asking.pop(mac) - 1) > 0:
                self._asking[mac] = left
        known = None if owner is None else KnownNode(owner.node_id, owner.hostname,
                                                     owner.state)
        if mac in self._stale:
            if mac not in self._asking:
                self._stale.discard(mac)
        else:
            if len(self._answers) >= MAX_ANSWERS:
                self._answers.clear()
            self._answers[mac] = (known, self._clock() + ANSWER_TTL_S)
        return known

    async def unknown_mac_booted(self, mac: str, client: str) -> None:
        self._send({"unknown": [mac, client]})

    def forget(self, macs: list[str] | None) -> None:
        """What the daemon said changed (None: anything)."""
        if macs is None:
            self._answers.clear()
            self._stale.update(self._asking)
            return
        for mac in macs:
            self._answers.pop(mac, None)
            if mac in self._asking:
                self._stale.add(mac)

    def learn(self, nodes: dict[str, KnownNode]) -> None:
        """What the daemon's conductor wrote of these MACs' nodes: the answer now, with no
        store read (a read out now answers its caller but is not kept over this)."""
        if len(self._answers) + len(nodes) > MAX_ANSWERS:
            self._answers.clear()
        until = self._clock() + ANSWER_TTL_S
        for mac, known in nodes.items():
            self._answers[mac] = (known, until)
            if mac in self._asking:
                self._stale.add(mac)


def dispatch(inventory: WorkerInventory, message: dict[str, Any]) -> None:
    """A message from the daemon (after ``init``)."""
    if "forget" in message:
        macs = message["forget"]
        if macs is not None and (not isinstance(macs, list)
                                 or not all(isinstance(mac, str) for mac in macs)):
            raise ValueError(f"forget: not a list of MACs: {macs!r:.80}")
        inventory.forget(macs)
    if "known" in message:
        inventory.learn(_known(message["known"]))


def _known(entries: Any) -> dict[str, KnownNode]:
    """``[[mac, node id, hostname or null, state], …]`` as the daemon sends it."""
    if not isinstance(entries, list) or not all(
            isinstance(e, list) and len(e) == 4 and isinstance(e[0], str)
            and isinstance(e[1], str) and isinstance(e[2], str | None)
            and isinstance(e[3], str) for e in entries):
        raise ValueError(f"known: not a list of [mac, node, hostname, state]: "
                         f"{entries!r:.80}")
    return {mac: KnownNode(node_id, hostname, state)
            for mac, node_id, hostname, state in entries}


async def serve(channel: Channel, init: dict[str, Any], listening: socket.socket,
                part: tuple[int, int]) -> None:
    """Until the daemon closes the control socket."""
    settings = DhcpSettings.model_validate(init["dhcp"])
    engine = db.make_engine(str(init["database_url"]))
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-boot")
    leases = LeaseRepo(engine, pool, cache_threshold=settings.cache_threshold)
    inventory = WorkerInventory(MacLookup(engine, pool), channel.send)
    server = DhcpServer(settings, BootSettings.model_validate(init["boot"]),
                        http_base_url=str(init["http_base_url"]), inventory=inventory,
                        leases=leases, part=part)
    server.serve_on(listening)
    gone = watch(channel, lambda message: dispatch(inventory, message))
    tune_gc()  # as the daemon does once started
    channel.send({"ready": os.getpid()})
    try:
        while not gone.done():
            await asyncio.wait([gone], timeout=OFFER_SWEEP_S)
            try:
                await leases.expire_offers()
            except Exception as exc:  # the store is away: the next sweep tries again
                log.warning("DHCP worker: sweeping lapsed offers failed: %s", exc)
    finally:
        await server.stop()
        pool.shutdown(wait=True)
        engine.dispose()


def main() -> None:
    parser = worker_parser(__doc__.splitlines()[0])
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args()
    channel, listening = attach(args)
    first = channel.receive()
    if first is None or "init" not in first:
        os._exit(0)  # the daemon went away before it said what to serve
    log_to(channel, args.log_level)
    asyncio.run(serve(channel, first["init"], listening, (args.slot, args.count)))
    os._exit(0)  # the daemon closed the control socket: what was held ends with us


if __name__ == "__main__":
    main()
