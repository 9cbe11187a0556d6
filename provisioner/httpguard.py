"""Limits every HTTP server of the daemon (the API and the boot server) puts on its clients
(docs/security.md, "Resource limits"):

- **per-source connections**: one address holds at most ``max_per_source`` connections; more
  are closed at once, so a flood from one address cannot take the others' sockets;
- **slow headers** (slowloris): a connection that has not sent a complete request head within
  ``header_timeout_s`` is closed (aiohttp's keep-alive timer, armed when the connection
  opens and after each response, does this: it is set to ``header_timeout_s``);
- **slow bodies and handlers**: a handler (reading the body included) that takes longer than
  ``request_timeout_s`` is answered ``408``; file bodies (``FileResponse``) are sent after the
  handler returns, so large downloads are not cut. After an early answer the unread body is
  drained for at most ``header_timeout_s``.
- **malformed requests**: aiohttp answers them ``400`` and would log each with a traceback at
  ERROR (a garbage flood: thousands of lines, enough for journald's rate limit to hide our
  own warnings); here each is one WARNING line without a traceback, at most one per
  ``BAD_REQUEST_LOG_S``, the next line counting those left out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.typedefs import Middleware

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_per_source: int = 256
    header_timeout_s: float = 15.0
    request_timeout_s: float = 120.0
    streaming_paths: frozenset[str] = frozenset()
    """Handlers that stream for as long as the client listens (server-sent events): no
    ``request_timeout_s`` (a client that stops reading is dropped by the stream itself)."""


def deadline_middleware(limits: HttpLimits) -> Middleware:
    """``request_timeout_s`` on each handler; ``408`` (a problem document) past it."""

    @web.middleware
    async def deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in limits.streaming_paths:
            return await handler(request)
        try:
            async with asyncio.timeout(limits.request_timeout_s):
                return await handler(request)
        except TimeoutError:
            log.warning("HTTP %s %s from %s: no answer within %.0f s (a slow client?); "
                        "closed", request.method, request.path, request.remote,
                        limits.request_timeout_s)
            body = json.dumps({"title": "Request Timeout", "status": 408,
                               "detail": f"request not complete within "
                                         f"{limits.request_timeout_s:g} s"})
            response = web.Response(status=408, text=body,
                                    content_type="application/problem+json")
            response.force_close()
            return response

    return deadline


class _SourceGate:
    """Open connections per source address."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._open: Counter[str] = Counter()
        self.refused = 0

    def enter(self, source: str) -> bool:
        if self._open[source] >= self._limit:
            self.refused += 1
            return False
        self._open[source] += 1
        return True

    def leave(self, source: str) -> None:
        self._open[source] -= 1
        if self._open[source] <= 0:
            del self._open[source]


class _Admitted(asyncio.Protocol):
    """aiohttp's protocol behind the per-source gate: every call is passed on."""

    def __init__(self, inner: asyncio.Protocol, gate: _SourceGate) -> None:
        self._inner, self._gate = inner, gate
        self._source: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self._gate.enter(source):
            if self._gate.refused % 1000 == 1:  # the first of a flood, then every 1000th
                log.warning("HTTP: %s holds too many connections; refusing more "
                            "(%d refused so far)", source, self._gate.refused)
            assert isinstance(transport, asyncio.Transport)
            transport.abort()
            return
        self._source = source
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._source is None:
            return
        self._gate.leave(self._source)
        self._source = None
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._source is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._source is not None else None

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class GuardedSite(web.TCPSite):
    """A TCP site whose connections pass the per-source gate."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, *,
                 limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self._gate = _SourceGate(limits.max_per_source)

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        gate = self._gate
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Admitted(server(), gate), self._host, self._port,
            reuse_address=self._reuse_address, backlog=self._backlog)


BAD_REQUEST_LOG_S = 10.0


class ServerLog(logging.Logger):
    """aiohttp's server logger (``aiohttp.server``) for one HTTP server: a request aiohttp
    could not parse (``BadHttpMessage``) is a client's fault, logged as one bounded,
    rate-limited warning; anything else goes through unchanged, traceback included."""

    def __init__(self, server: str, *, interval_s: float = BAD_REQUEST_LOG_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__("aiohttp.server")
        self.parent = logging.getLogger("aiohttp.server")  # its handlers and level
        self._server = server
        self._interval_s = interval_s
        self._clock = clock
        self._next_at = 0.0
        self._left_out = 0

    def exception(self, msg: object, *args: object, exc_info: Any = True,
                  **kwargs: Any) -> None:
        if isinstance(exc_info, BadHttpMessage):
            self._bad_request(args[0] if args else None, exc_info)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        if isinstance(kwargs.get("exc_info"), BadHttpMessage):  # non-HTTP on the port
            self._bad_request(args[0] if args else None, kwargs["exc_info"])
            return
        super().debug(msg, *args, **kwargs)

    def _bad_request(self, remote: object, exc: BadHttpMessage) -> None:
        now = self._clock()
        if now < self._next_at:
            self._left_out += 1
            return
        self._next_at = now + self._interval_s
        left_out, self._left_out = self._left_out, 0
        reason = " ".join(str(exc.message or type(exc).__name__).split())  # one line
        reason = reason.encode("ascii", "backslashreplace").decode()[:120]
        more = f" ({left_out} more since the last line)" if left_out else ""
        self.warning("%s: malformed HTTP request from %s answered 400: %s%s", self._server,
                     str(remote)[:64], reason, more)


def guarded_runner(app: web.Application, limits: HttpLimits, *,
                   name: str = "HTTP") -> web.AppRunner:
    """An ``AppRunner`` with the deadline middleware and the header timeout; start it on a
    ``GuardedSite``."""
    app.middlewares.insert(0, deadline_middleware(limits))
    # lingering_time: how long an unread body is drained after an early answer (a 408, a
    # 413); aiohttp's 10 s would let a trickling client keep the socket that long
    return web.AppRunner(app, access_log=None, handle_signals=False, logger=ServerLog(name),
                         keepalive_timeout=limits.header_timeout_s,
                         lingering_time=min(limits.header_timeout_s, 10.0))
