"""File bodies whose ``sendfile(2)`` copies run beside the event loop, not in it.

aiohttp's ``FileResponse`` sends through ``loop.sendfile``, which calls ``os.sendfile`` in the
loop's thread: on loopback and veth the kernel does the whole TCP path of each copy (and the
receiver's) inside that call, so in a boot storm the loop spent 43 % of its time there while
DHCP and TFTP packets waited (docs/performance.md, "Boot storm"). Here each copy runs in a
small, named thread pool (``os.sendfile`` releases the GIL), and only the waiting for a
writable socket stays in the loop: a thread never waits for a slow client, so a few threads
serve any number of downloads. Ranges, conditional requests and headers stay aiohttp's.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.web_request import BaseRequest

from provisioner.boot.http_pumps import Pumps

MAX_COPY = 4 << 20  # bytes one sendfile call may copy (another download's turn after it)


class SendfileThreads:
    """The bounded pool the copies run in (``http.sendfile_threads``), or as many pumps
    (``http.sendfile_pumps``: ``http_pumps.py``)."""

    def __init__(self, threads: int, *, pumps: bool = False) -> None:
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="http-sendfile")
        self._pumps = Pumps(threads) if pumps else None

    async def copy(self, sock_fd: int, file_fd: int, offset: int, count: int) -> None:
        if self._pumps is not None:
            await self._pumps.copy(sock_fd, file_fd, offset, count)
        else:
            await _copy(self.pool, sock_fd, file_fd, offset, count)

    def file(self, path: Path, *, chunk_size: int = 256 * 1024) -> web.FileResponse:
        return OffLoopFileResponse(path, self, chunk_size=chunk_size)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self._pumps is not None:
            self._pumps.close()


class OffLoopFileResponse(web.FileResponse):
    def __init__(self, path: Path, threads: SendfileThreads, *,
                 chunk_size: int = 256 * 1024) -> None:
        super().__init__(path, chunk_size=chunk_size)
        self._threads = threads

    async def _sendfile(self, request: BaseRequest, fobj: IO[Any], offset: int,
                        count: int) -> AbstractStreamWriter:
        # asyncio's selector transport: its (private) empty-buffer waiter is what
        # loop.sendfile itself uses to put the head on the wire before the body
        transport: Any = request.transport
        if (self.compression or transport is None
                or not hasattr(transport, "_make_empty_waiter")):  # TLS, or not a selector loop
            return await super()._sendfile(request, fobj, offset, count)
        writer = await web.StreamResponse.prepare(self, request)
        assert writer is not None
        reading = transport.is_reading()
        transport.pause_reading()
        await transport._make_empty_waiter()  # the head is on the wire before the body
        try:
            await self._threads.copy(transport.get_extra_info("socket").fileno(),
                                     fobj.fileno(), offset, count)
        finally:
            transport._reset_empty_waiter()
            if reading and not transport.is_closing():
                transport.resume_reading()
        await web.StreamResponse.write_eof(self)
        return writer


async def _copy(pool: ThreadPoolExecutor, sock_fd: int, file_fd: int, offset: int,
                count: int) -> None:
    """``count`` bytes of ``file_fd`` from ``offset`` to the (non-blocking) socket: copies
    in ``pool``, waits for room in the loop (on a duplicate of the socket's descriptor: the
    transport still owns the original)."""
    loop = asyncio.get_running_loop()
    end = offset + count
    watch = os.dup(sock_fd)
    try:
        while offset < end:
            sent = await loop.run_in_executor(pool, _send, sock_fd, file_fd, offset,
                                              min(end - offset, MAX_COPY))
            if sent is None:
                await _writable(loop, watch)
            elif sent == 0:
                raise ConnectionResetError("file ended before the announced length")
            else:
                offset += sent
    finally:
        os.close(watch)


def _send(sock_fd: int, file_fd: int, offset: int, count: int) -> int | None:
    try:
        return os.sendfile(sock_fd, file_fd, offset, count)
    except (BlockingIOError, InterruptedError):
        return None  # the socket's buffer is full


async def _writable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_writer(fd, wake)
    try:
        await ready
    finally:
        loop.remove_writer(fd)
