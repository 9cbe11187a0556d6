"""File bodies copied beside the event loop (``boot/http_sendfile.py``, and with
``http.sendfile_pumps`` ``boot/http_pumps.py``: every test runs with both), downloaded by curl
on loopback: whole files and ranges arrive intact with one copy thread serving several
downloads; a client that stops reading does not hold that thread (another download
finishes meanwhile); a client gone mid-body leaves no descriptor behind and the server
serves on."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from provisioner.boot.http_pumps import Pumps
from provisioner.boot.http_sendfile import SendfileThreads

SIZE = 24 << 20


@pytest.fixture
def data() -> bytes:
    return os.urandom(SIZE)


@pytest.fixture
def blob(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "initrd.gz"
    path.write_bytes(data)
    return path


@pytest.fixture(params=[False, True], ids=["pool", "pumps"])
async def url(blob: Path, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    threads = SendfileThreads(1, pumps=request.param)  # one copy thread for every download

    async def handler(_request: web.Request) -> web.StreamResponse:
        return threads.file(blob)

    app = web.Application()
    app.router.add_get("/blob", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}/blob"
    await runner.cleanup()
    threads.close()


async def curl(url: str, *args: str) -> bytes:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--fail", "--max-time", "60", *args, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_whole_files_and_ranges_arrive_intact(url: str, data: bytes) -> None:
    bodies = await asyncio.gather(*(curl(url) for _ in range(4)),
                                  curl(url, "-r", f"{20 << 20}-{(20 << 20) + 99}"),
                                  curl(url, "-r", f"{SIZE - 5}-"))
    assert [digest(body) for body in bodies[:4]] == [digest(data)] * 4
    assert bodies[4] == data[20 << 20:(20 << 20) + 100]
    assert bodies[5] == data[-5:]


async def test_a_client_that_stops_reading_does_not_hold_the_copy_thread(
        url: str, data: bytes) -> None:
    host, port = url.split("/")[2].split(":")
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect((host, int(port)))
    stalled.sendall(b"GET /blob HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        await asyncio.sleep(0.3)  # its download has started and filled the buffers
        body = await asyncio.wait_for(curl(url), 30)  # the only copy thread is free
        assert digest(body) == digest(data)
    finally:
        stalled.close()


async def test_a_client_gone_mid_body_leaves_nothing_behind(url: str, data: bytes) -> None:
    await curl(url, "-r", "0-0")  # the server's sockets and pools are up
    before = open_fds()
    host, port = url.split("/")[2].split(":")
    for _ in range(5):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /blob HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readexactly(1 << 20)  # a megabyte of the body, then hang up
        writer.transport.abort()
    await asyncio.sleep(0.5)
    assert digest(await curl(url)) == digest(data)  # serves on
    await asyncio.sleep(0.2)
    assert open_fds() <= before


async def test_a_cancelled_pump_copy_lets_go_and_the_pump_serves_on(blob: Path,
                                                                    data: bytes) -> None:
    """A download cancelled while its pump waits for room (the peer reads nothing): the
    copy ends cancelled, its descriptor is closed, and the same pump copies the next one."""
    pumps = Pumps(1)
    try:
        with blob.open("rb") as fobj:
            stalled, peer = socket.socketpair()
            with stalled, peer:
                stalled.setblocking(False)
                before = open_fds()
                copy = asyncio.create_task(pumps.copy(stalled.fileno(), fobj.fileno(), 0, SIZE))
                await asyncio.sleep(0.3)  # the socket's buffer is full: the pump waits
                assert not copy.done()
                copy.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await copy
                assert open_fds() == before
            sender, reader = socket.socketpair()
            with sender, reader:
                sender.setblocking(False)
                received = bytearray()

                def drain() -> None:
                    while len(received) < SIZE:
                        chunk = reader.recv(1 << 20)
                        if not chunk:
                            return
                        received.extend(chunk)

                draining = asyncio.get_running_loop().run_in_executor(None, drain)
                await asyncio.wait_for(pumps.copy(sender.fileno(), fobj.fileno(), 0, SIZE), 30)
                await asyncio.wait_for(draining, 30)
                assert digest(bytes(received)) == digest(data)
    finally:
        pumps.close()
