"""``GET /api/v1/events``: node transitions as server-sent events.

``EventHub`` is a conductor observer: each committed transition is serialised once and
appended to every client's bounded queue. Publishing never waits: a client whose queue is
full (it reads slower than the fleet changes) is dropped, told so if it still listens, and
its stream ends; the daemon is never slowed by a browser. A write that does not complete
within ``WRITE_TIMEOUT_S`` ends that stream too.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from datetime import UTC, datetime
from typing import Final

from aiohttp import hdrs, web

from provisioner.domain import Node
from provisioner.lifecycle.states import NodeState

log = logging.getLogger(__name__)

HEARTBEAT_S: Final = 15.0
WRITE_TIMEOUT_S: Final = 10.0


class Client:
    def __init__(self, limit: int) -> None:
        self.queue: deque[bytes] = deque()
        self.limit = limit
        self.dropped = False
        self.closed = False
        self.wake = asyncio.Event()

    def offer(self, frame: bytes) -> bool:
        """Queue ``frame``; False (and the client marked dropped) when the queue is full."""
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
        self._seq = 0
        self.dropped = 0

    def observe(self, node: Node, event: str, before: NodeState) -> None:
        """Conductor observer: O(clients), never blocks, never raises."""
        if not self._clients:
            return
        self._seq += 1
        frame = encode(self._seq, "transition", {
            "id": node.id, "hostname": node.hostname, "state": str(node.state),
            "before": str(before), "event": event, "maintenance": node.maintenance,
            "maintenance_reason": node.maintenance_reason, "last_error": node.last_error,
            "at": datetime.now(UTC).isoformat()})
        for client in list(self._clients):
            if not client.offer(frame):
                self._clients.discard(client)
                self.dropped += 1
                log.warning("events: dropped a client that fell %d events behind",
                            self._limit)

    def subscribe(self) -> Client:
        client = Client(self._limit)
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


def encode(seq: int, kind: str, data: object) -> bytes:
    # json.dumps escapes newlines, so one data line is always enough
    return f"id: {seq}\nevent: {kind}\ndata: {json.dumps(data)}\n\n".encode()


async def stream(request: web.Request, hub: EventHub) -> web.StreamResponse:
    response = web.StreamResponse(headers={
        hdrs.CONTENT_TYPE: "text/event-stream", hdrs.CACHE_CONTROL: "no-store",
        "X-Accel-Buffering": "no"})
    client = hub.subscribe()
    try:
        await response.prepare(request)
        await _write(response, b"retry: 2000\n: connected\n\n")
        while not client.closed:
            try:
                async with asyncio.timeout(HEARTBEAT_S):
                    await client.wake.wait()
            except TimeoutError:
                await _write(response, b": keep-alive\n\n")
                continue
            client.wake.clear()
            if client.dropped:
                await _write(response, encode(0, "dropped", {"reason": "too slow"}))
                break
            while client.queue:
                await _write(response, client.queue.popleft())
    except (ConnectionError, TimeoutError):
        pass  # the client went away or stopped reading: nothing to tell anyone
    finally:
        hub.unsubscribe(client)
    return response


async def _write(response: web.StreamResponse, frame: bytes) -> None:
    async with asyncio.timeout(WRITE_TIMEOUT_S):
        await response.write(frame)
