"""Downloads copied by pumps (``http.sendfile_pumps``): a few threads, each owning the
downloads handed to it, wait on their own ``epoll`` for those sockets to have room and copy
up to ``MAX_TURN`` bytes into each writable one in turn (``os.sendfile`` and ``epoll.poll``
release the GIL), as an nginx worker does. The event loop hands a body over once and hears
back once, when it is sent; the thread pool of ``http_sendfile.py`` instead takes a trip
through the loop and the pool for every chunk (in a storm of 200 clients such a trip took
12-60 ms of queueing and GIL hand-offs against 1.5-3 ms of copying; docs/performance.md,
"Boot storm"). A pump never waits for a slow client, so a few pumps serve any number of
downloads. On by default since a storm on an idle machine showed it helps. A pump runs at
the daemon's own priority: made 5 nicer (session 15), pumps let the late clients' DHCP and
TFTP go first, and the early clients' downloads dragged on to the end of a storm (1,000
clients on 2 cores: the median client at 0.75x the speed of dnsmasq + tftpd-hpa + nginx
with the niceness, 0.89-0.96x without; docs/performance.md, "Boot storm", session 18).
Three by default (``http.sendfile_threads``): on 2 CPUs, four took enough CPU from the late
clients' boot path to cost the last client, two left the downloads short.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import select
import threading
from collections import deque
from contextlib import suppress
from dataclasses import dataclass, field

MAX_COPY = 4 << 20  # bytes one sendfile call may copy
MAX_TURN = 4 << 20  # bytes one download gets per turn (the other writable ones after it)


class Pumps:
    """``count`` pumps; downloads go to them in turn."""

    def __init__(self, count: int) -> None:
        self._pumps = [Pump(f"http-sendfile_{i}") for i in range(count)]
        self._turn = itertools.cycle(self._pumps)

    async def copy(self, sock_fd: int, file_fd: int, offset: int, count: int) -> None:
        await pump_copy(next(self._turn), sock_fd, file_fd, offset, count)

    def close(self) -> None:
        for pump in self._pumps:
            pump.stop()


@dataclass(eq=False)
class _Body:
    """One download a pump copies: ``[offset, end)`` of ``file_fd`` to socket ``fd`` (the
    pump's duplicate of the transport's descriptor), ``done`` resolved on the loop."""

    fd: int
    file_fd: int
    offset: int
    end: int
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[None] = field(repr=False)


async def pump_copy(pump: Pump, sock_fd: int, file_fd: int, offset: int, count: int) -> None:
    """``count`` bytes of ``file_fd`` from ``offset`` to the (non-blocking) socket, copied
    by ``pump`` on a duplicate of the socket's descriptor (the transport still owns the
    original). Cancelled, the pump lets go of the body before this returns."""
    loop = asyncio.get_running_loop()
    body = _Body(os.dup(sock_fd), file_fd, offset, offset + count, loop, loop.create_future())
    try:
        pump.hand(("add", body))
        try:
            await asyncio.shield(body.done)
        except asyncio.CancelledError:
            pump.hand(("drop", body))
            while not body.done.done():  # the pump still holds the descriptors
                try:
                    await asyncio.shield(body.done)
                except asyncio.CancelledError:
                    continue
                except OSError:
                    break
            body.done.exception()  # resolved, and looked at: no "never retrieved" warning
            raise
    finally:
        os.close(body.fd)


def _resolve(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)


class Pump(threading.Thread):
    """A thread that copies the bodies handed to it into their sockets as they have room
    (level-triggered ``EPOLLOUT``); the loop talks to it through a queue and a pipe."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._orders: deque[tuple[str, _Body]] = deque()
        self._bodies: dict[int, _Body] = {}
        self._stopping = False
        self._stopped = False
        self.start()

    def hand(self, order: tuple[str, _Body]) -> None:
        """``("add", body)``: copy it; ``("drop", body)``: let go of it (resolved early)."""
        if self._stopped:
            _resolve(order[1].done, ConnectionResetError("the server is stopping"))
            return
        self._orders.append(order)
        self._wake()
        if self._stopped:  # it stopped meanwhile: nobody else takes the order
            while self._orders:
                _resolve(self._orders.popleft()[1].done,
                         ConnectionResetError("the server is stopping"))

    def stop(self) -> None:
        """Ends the thread (the bodies it still has fail) and closes its descriptors."""
        self._stopping = True
        self._wake()
        self.join(timeout=5.0)  # a turn of copies at most
        if not self.is_alive():
            self._epoll.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _wake(self) -> None:
        with suppress(BlockingIOError):  # the pipe is full: a wake-up is waiting already
            os.write(self._wake_w, b"\0")

    def run(self) -> None:
        try:
            while not self._stopping:
                for fd, _ in self._epoll.poll():
                    if fd == self._wake_r:
                        self._take_orders()
                    elif (body := self._bodies.get(fd)) is not None:
                        self._pump(body)
        finally:
            self._stopped = True
            self._take_orders()
            for body in list(self._bodies.values()):
                self._finish(body, ConnectionResetError("the server is stopping"))

    def _take_orders(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while self._orders:
            what, body = self._orders.popleft()
            if what == "drop":
                if self._bodies.get(body.fd) is body:
                    self._finish(body, None)
            elif self._stopping:
                self._finish(body, ConnectionResetError("the server is stopping"))
            else:
                try:
                    self._epoll.register(body.fd, select.EPOLLOUT)
                except OSError as exc:
                    self._finish(body, exc)
                    continue
                self._bodies[body.fd] = body
                self._pump(body)  # its socket most likely has room now

    def _pump(self, body: _Body) -> None:
        """Up to ``MAX_TURN`` bytes while the socket takes them; done, or wait for room."""
        turn_end = body.offset + MAX_TURN
        while body.offset < body.end:
            if body.offset >= turn_end:
                return  # the other writable sockets' turn; this one's still registered
            try:
                sent = os.sendfile(body.fd, body.file_fd, body.offset,
                                   min(body.end - body.offset, MAX_COPY))
            except (BlockingIOError, InterruptedError):
                return  # the socket's buffer is full: epoll says when it has room
            except OSError as exc:
                self._finish(body, exc)
                return
            if sent == 0:
                self._finish(body, ConnectionResetError("file ended before the announced "
                                                        "length"))
                return
            body.offset += sent
        self._finish(body, None)

    def _finish(self, body: _Body, error: BaseException | None) -> None:
        if self._bodies.pop(body.fd, None) is not None:
            self._epoll.unregister(body.fd)
        with suppress(RuntimeError):  # the loop is closed: nobody waits any more
            body.loop.call_soon_threadsafe(_resolve, body.done, error)
