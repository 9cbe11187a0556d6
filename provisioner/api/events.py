"""``GET /api/v1/events``: the fleet's transitions as server-sent events, resumable.

The source is the store's history table, which every daemon on the database writes: the
``EventFeed`` reads the rows after the last one it saw (at once when this daemon's conductor
commits one, else every ``POLL_S``), so a client of any daemon sees every daemon's
transitions. With no client connected it reads nothing (a fleet onboarding with nobody
watching would read the history once per transition per daemon); the first client arms it.
Each frame's ``id:`` is the row's fleet-wide id; a client that reconnects with
``Last-Event-ID`` (or ``?since=ID``) first gets the rows after it, then the live stream, with
no row twice. ``?last=N`` starts with the newest N rows, ``?node=`` keeps one node's (id or
hostname), ``?follow=false`` ends the stream after those rows (``provisioner events``).

On PostgreSQL a row's id is taken at insert and becomes visible at commit, so a slower
transaction can commit a lower id after a higher one was read: the feed asks again for the
ids it skipped, for ``GAP_S``.

``EventHub`` fans each frame out to every client's bounded queue. Publishing never waits: a
client whose queue is full (it reads slower than the fleet changes) is dropped, told so if it
still listens, and its stream ends (it may reconnect with ``Last-Event-ID``); the daemon is
never slowed by a browser. A write that does not complete within ``WRITE_TIMEOUT_S`` ends
that stream too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from aiohttp import hdrs, web

from provisioner.domain import FleetEvent, Node
from provisioner.errors import InvalidRequest
from provisioner.lifecycle.states import NodeState
from provisioner.store.node_reads import NodeReads

log = logging.getLogger(__name__)

HEARTBEAT_S: Final = 15.0
WRITE_TIMEOUT_S: Final = 10.0
POLL_S: Final = 1.0  # how soon another daemon's transition reaches this daemon's clients
GAP_S: Final = 10.0  # how long an id skipped by the feed is asked for again
PAGE: Final = 500


@dataclass(frozen=True, slots=True)
class Frame:
    id: int | None  # the history row's fleet-wide id; None: not from the history
    node_id: str
    hostname: str | None
    data: bytes


class Client:
    def __init__(self, limit: int, node: str | None = None) -> None:
        self.queue: deque[Frame] = deque()
        self.limit = limit
        self.node = node
        self.dropped = False
        self.closed = False
        self.wake = asyncio.Event()

    def wants(self, frame: Frame) -> bool:
        return self.node is None or self.node in (frame.node_id, frame.hostname)

    def offer(self, frame: Frame) -> bool:
        """Queue ``frame``; False (and the client marked dropped) when the queue is full."""
        if not self.wants(frame):
            return True
        if len(self.queue) >= self.limit:
            self.dropped = True
            self.queue.clear()
            self.wake.set()
            return False
        self.queue.append(frame)
        self.wake.set()
        return True


class EventHub:
    def __init__(self, queue_limit: int = 256) -> None:
        self._limit = queue_limit
        self._clients: set[Client] = set()
        self.dropped = 0

    def observe(self, node: Node, event: str, before: NodeState) -> None:
        """Publish a note about ``node`` that is not a history row (no ``id:``)."""
        if self._clients:
            self.publish(Frame(None, node.id, node.hostname, encode(None, "transition", {
                "id": node.id, "hostname": node.hostname, "state": str(node.state),
                "before": str(before), "event": event, "maintenance": node.maintenance,
                "maintenance_reason": node.maintenance_reason,
                "last_error": node.last_error, "at": datetime.now(UTC).isoformat()})))

    def publish(self, frame: Frame) -> None:
        """O(clients), never blocks, never raises."""
        for client in list(self._clients):
            if not client.offer(frame):
                self._clients.discard(client)
                self.dropped += 1
                log.warning("events: dropped a client that fell %d events behind",
                            self._limit)

    def subscribe(self, node: str | None = None) -> Client:
        client = Client(self._limit, node)
        self._clients.add(client)
        return client

    def unsubscribe(self, client: Client) -> None:
        self._clients.discard(client)

    def close(self) -> None:
        """End every stream (the daemon stops)."""
        for client in self._clients:
            client.closed = True
            client.wake.set()
        self._clients.clear()

    def __len__(self) -> int:
        return len(self._clients)


class EventFeed:
    """Reads the history rows every daemon writes and publishes them to the hub."""

    def __init__(self, repo: NodeReads, hub: EventHub, poll_s: float = POLL_S) -> None:
        self._repo = repo
        self._hub = hub
        self._poll_s = poll_s
        self._wake = asyncio.Event()
        self._cursor: int | None = None
        self._gaps: dict[int, float] = {}  # id skipped -> when

    def poke(self, node: Node, event: str, before: NodeState) -> None:
        """Conductor observer: our own transition is committed, read it now."""
        self._wake.set()

    def wake(self) -> None:
        """Another daemon wrote a node (PostgreSQL's NOTIFY): read now, not at the poll."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self.read()
            except Exception as exc:  # the database away: the next poll tries again
                log.info("events: history not read (%s)", type(exc).__name__)
            try:
                async with asyncio.timeout(self._poll_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()

    async def arm(self) -> None:
        """Take the cursor now if the feed has none (a stream calls this after subscribing,
        before it says it is connected: every row committed after that reaches it)."""
        if self._cursor is None:
            self._cursor = await self._repo.last_event_id()

    async def read(self) -> None:
        if not self._hub:  # nobody follows: no read (each transition of every daemon woke
            self._cursor = None  # one, 4-5 a node; docs/performance.md "HA fleet")
            self._gaps.clear()
            return
        if self._cursor is None:
            self._cursor = await self._repo.last_event_id()
            return
        now = time.monotonic()
        self._gaps = {i: at for i, at in self._gaps.items() if now - at < GAP_S}
        while True:
            rows = await self._repo.events(after=self._cursor, also=self._gaps, limit=PAGE)
            for row in rows:
                self._gaps.pop(row.id, None)
                if row.id > self._cursor:
                    for missing in range(max(self._cursor + 1, row.id - 100), row.id):
                        self._gaps.setdefault(missing, now)
                    self._cursor = row.id
                self._hub.publish(frame_of(row))
            if len(rows) < PAGE:
                return


def frame_of(row: FleetEvent) -> Frame:
    entry = row.entry
    data = {"transition": row.id, "id": entry.node_id, "hostname": row.hostname,
            "state": entry.to_state, "before": entry.from_state, "event": entry.event,
            "actor": entry.actor, "reason": entry.reason, "at": entry.at.isoformat(),
            "instance": entry.instance, "maintenance": row.maintenance,
            "maintenance_reason": row.maintenance_reason, "last_error": row.last_error}
    return Frame(row.id, entry.node_id, row.hostname, encode(row.id, "transition", data))


def encode(seq: int | None, kind: str, data: object) -> bytes:
    # json.dumps escapes newlines, so one data line is always enough; no id: keeps the
    # client's Last-Event-ID as it was
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


@dataclass(frozen=True, slots=True)
class Query:
    since: int | None
    last: int
    node: str | None
    follow: bool


def parse_query(request: web.Request) -> Query:
    since_text = request.headers.get("Last-Event-ID") or request.query.get("since")
    last_text = request.query.get("last", "0")
    for name, text in (("since", since_text), ("last", last_text)):
        if text is not None and not text.isdigit():
            raise InvalidRequest(f"{name}: expected a whole number, got {text[:40]!r}")
    follow = request.query.get("follow", "true").lower()
    if follow not in ("true", "false", "1", "0"):
        raise InvalidRequest("follow: expected true or false")
    return Query(int(since_text) if since_text is not None else None, int(last_text),
                 request.query.get("node") or None, follow in ("true", "1"))


async def stream(request: web.Request, hub: EventHub, feed: EventFeed,
                 repo: NodeReads) -> web.StreamResponse:
    query = parse_query(request)  # before any header goes out: a 400 stays a problem
    response = web.StreamResponse(headers={
        hdrs.CONTENT_TYPE: "text/event-stream", hdrs.CACHE_CONTROL: "no-store",
        "X-Accel-Buffering": "no"})
    client = hub.subscribe(query.node)  # before the backlog: nothing falls in between
    try:
        await feed.arm()  # an idle feed (no client until now) reads from here on
        await response.prepare(request)
        await _write(response, b"retry: 2000\n: connected\n\n")
        sent = await _backlog(response, repo, query)
        if not query.follow:
            return response
        while not client.closed:
            try:
                async with asyncio.timeout(HEARTBEAT_S):
                    await client.wake.wait()
            except TimeoutError:
                await _write(response, b": keep-alive\n\n")
                continue
            client.wake.clear()
            if client.dropped:
                await _write(response, encode(None, "dropped", {"reason": "too slow"}))
                break
            while client.queue:
                frame = client.queue.popleft()
                if frame.id is None or frame.id > sent:
                    await _write(response, frame.data)
    except (ConnectionError, TimeoutError):
        pass  # the client went away or stopped reading: nothing to tell anyone
    finally:
        hub.unsubscribe(client)
    return response


async def _backlog(response: web.StreamResponse, repo: NodeReads, query: Query) -> int:
    """Write the rows the query asks for from the history; the last id written."""
    sent = query.since or 0
    if query.last:
        for row in await repo.events(limit=min(query.last, 10_000), node=query.node,
                                     newest=True, after=sent):
            await _write(response, frame_of(row).data)
            sent = row.id
    elif query.since is None:
        return 0 if query.follow else sent
    while True:
        rows = await repo.events(after=sent, limit=PAGE, node=query.node)
        for row in rows:
            await _write(response, frame_of(row).data)
            sent = row.id
        if len(rows) < PAGE:
            return sent


async def _write(response: web.StreamResponse, frame: bytes) -> None:
    async with asyncio.timeout(WRITE_TIMEOUT_S):
        await response.write(frame)
