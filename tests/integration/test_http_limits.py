"""Slow and greedy clients against the boot HTTP server behind the daemon's HTTP limits
(``httpguard``, the same runner and site the daemon uses for the API and the boot server):
a client trickling its headers or its body is cut off, one address cannot hold more than its
share of connections, and the others are served all along. Real sockets on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from provisioner.boot.http import DISCOVERY_BURST_PER_SOURCE
from provisioner.httpguard import HttpLimits, deadline_middleware
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.integration.boot_support import Segment, running_segment
from tests.integration.test_boot_http import agent_args

LIMITS = HttpLimits(max_per_source=4, header_timeout_s=1.0, request_timeout_s=1.0)
BOUND_S = 10.0  # far above the limits: only a server that never cuts the client misses it


@pytest.fixture
async def segment(store: Store, world: SimWorld, tmp_path: Path) -> AsyncIterator[Segment]:
    async with running_segment(store, world, tmp_path, LIMITS) as started:
        yield started


async def connect(segment: Segment, source: str = "127.0.0.1") -> tuple[
        asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = segment.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port), local_addr=(source, 0))


async def served(segment: Segment, source: str = "127.0.0.1") -> int:
    status, _ = await segment.call(source, "GET", "/boot.ipxe")
    return status


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (within BOUND_S)."""
    async with asyncio.timeout(BOUND_S):
        return await reader.read()


async def trickle(writer: asyncio.StreamWriter, line: bytes, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            writer.write(line)
            await writer.drain()
        except (ConnectionError, RuntimeError):
            return
        await asyncio.sleep(0.2)


async def test_a_client_trickling_its_headers_is_cut_off(segment: Segment) -> None:
    reader, writer = await connect(segment)
    writer.write(b"GET /boot.ipxe HTTP/1.1\r\nHost: x\r\n")
    stop = asyncio.Event()
    task = asyncio.create_task(trickle(writer, b"X-Slow: 1\r\n", stop))
    assert await served(segment) == 200  # the others are served meanwhile
    got = await closed_by_server(reader)
    stop.set()
    await task
    assert b"200 OK" not in got  # never answered: the head was never complete
    writer.close()


async def test_a_client_trickling_its_body_gets_408(segment: Segment) -> None:
    status, script = await segment.script("127.0.0.1")
    token = agent_args(script)["token"]
    reader, writer = await connect(segment)
    writer.write(b"POST /agent/v1/facts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: 100000\r\nAuthorization: Bearer " + token.encode()
                 + b"\r\n\r\n{")
    stop = asyncio.Event()
    task = asyncio.create_task(trickle(writer, b" ", stop))
    got = await closed_by_server(reader)
    stop.set()
    await task
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), got[:200]
    assert json.loads(body)["status"] == 408
    assert await served(segment) == 200
    writer.close()


async def test_a_silent_connection_is_closed(segment: Segment) -> None:
    reader, writer = await connect(segment)
    assert await closed_by_server(reader) == b""
    writer.close()


async def test_one_address_cannot_take_every_connection(segment: Segment) -> None:
    greedy = [await connect(segment, "127.0.0.2") for _ in range(LIMITS.max_per_source)]
    reader, writer = await connect(segment, "127.0.0.2")  # one too many: closed at once
    try:
        got = await closed_by_server(reader)
    except ConnectionResetError:
        got = b""
    assert got == b""
    assert await served(segment, "127.0.0.3") == 200  # another address is served
    for _, held in greedy:
        held.close()
    writer.close()
    await asyncio.sleep(0.2)  # the server sees the closes
    assert await served(segment, "127.0.0.2") == 200  # its share is free again


async def test_keep_alive_requests_and_file_bodies_still_work(segment: Segment,
                                                              tmp_path: Path) -> None:
    """The limits do not cut normal use: several requests on one connection."""
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(5):
            async with session.get(f"{segment.url}/boot.ipxe") as response:
                assert response.status == 200
                assert (await response.text()).startswith("#!ipxe")


async def test_one_address_cannot_use_up_discovery(store: Store, world: SimWorld,
                                                   tmp_path: Path) -> None:
    """Made-up MACs from one address: that address gets its discovery budget, and a new
    machine elsewhere is still discovered (the shared discovery rate is not used up)."""
    async with running_segment(store, world, tmp_path, LIMITS,
                               discovery_burst=40) as segment:
        scripts = [(await segment.script("127.0.0.2", f"52:54:00:0f:00:{i:02x}"))[1]
                   for i in range(30)]
        deferred = [s for s in scripts if "over their budget" in s]
        assert len(deferred) == 30 - DISCOVERY_BURST_PER_SOURCE
        assert sum((await store.nodes.count_by_state()).values()) == \
            DISCOVERY_BURST_PER_SOURCE
        status, script = await segment.script("127.0.0.3", "52:54:00:0f:01:01")
        assert status == 200 and "provisioner.token=" in script  # discovered, inspected
        known = await segment.script("127.0.0.2", "52:54:00:0f:00:00")  # a known MAC
        assert "over their budget" not in known[1]


async def test_an_event_stream_outlives_the_request_deadline(aiohttp_client: Any) -> None:
    """Server-sent events (``/api/v1/events``) stream for as long as the client listens: the
    handler deadline that answers a slow handler 408 does not cut a streaming path."""
    limits = HttpLimits(request_timeout_s=0.3, streaming_paths=frozenset({"/stream"}))

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1.0)
        return web.Response(text="late")

    app = web.Application(middlewares=[deadline_middleware(limits)])
    app.router.add_get("/stream", slow)
    app.router.add_get("/other", slow)
    client = await aiohttp_client(app)
    streamed, other = await asyncio.gather(client.get("/stream"), client.get("/other"))
    assert (streamed.status, await streamed.text()) == (200, "late")
    assert other.status == 408
