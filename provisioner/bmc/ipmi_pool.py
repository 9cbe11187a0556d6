"""IPMI worker processes (``ipmi_worker.py``) driven from the event loop over pipes.

Each BMC belongs to one worker (a stable hash of its address and port), which keeps its
pyghmi session. A call is one JSON line out and one back; the caller's own deadline bounds
its wait. A watchdog replaces a worker (SIGKILL, then a fresh process) when it misses its
heartbeat (stopped, dead, or so wedged it cannot even beat) or when a call stays
unanswered ``grace_s`` past its deadline (pyghmi stuck): that worker's calls in flight
fail as ``BmcUnreachable`` (retryable; the breaker decides), its BMCs log in again on their
next call, and the other workers' BMCs never wait for any of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import signal
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Final

from provisioner.bmc.base import BmcUnreachable

log = logging.getLogger(__name__)

_MODULE: Final = "provisioner.bmc.ipmi_worker"
_LINE_LIMIT: Final = 1 << 20


class WorkerError(Exception):
    """A call's error as the worker reported it: ``kind`` (ipmi, pyghmi, os, credentials,
    internal) and pyghmi's text; ``ipmi.py`` maps it to a BmcError."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(f"{kind}: {text}")
        self.kind, self.text = kind, text


@dataclass(frozen=True, slots=True)
class Answer:
    value: Any
    session: bool
    """Whether the worker holds a live session with that BMC after the call."""


@dataclass(eq=False)
class _Worker:
    slot: int
    proc: asyncio.subprocess.Process
    last_beat: float
    pending: dict[int, tuple[asyncio.Future[Answer], float]] = field(default_factory=dict)
    reader: asyncio.Task[None] | None = None
    dead: bool = False
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pid(self) -> int:
        return self.proc.pid


class IpmiWorkers:
    def __init__(self, *, count: int = 4, threads: int = 8, heartbeat_s: float = 0.5,
                 heartbeat_timeout_s: float = 10.0, grace_s: float = 15.0,
                 python: str = sys.executable) -> None:
        self._count = count
        self._threads = threads
        self._heartbeat_s = heartbeat_s
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._grace_s = grace_s
        self._python = python
        self._workers: list[_Worker | None] = [None] * count
        self._starting: dict[int, asyncio.Lock] = {i: asyncio.Lock() for i in range(count)}
        self._ids = itertools.count(1)
        self._watchdog: asyncio.Task[None] | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.replaced = 0
        """Workers killed and replaced so far (tests and metrics read it)."""

    def slot_of(self, address: str, port: int) -> int:
        return zlib.crc32(f"{address}:{port}".encode()) % self._count

    def pid(self, slot: int) -> int | None:
        worker = self._workers[slot]
        return worker.pid if worker is not None and not worker.dead else None

    async def start(self, *, timeout_s: float = 30.0) -> None:
        """Start every worker now (else each starts on its first call)."""
        await asyncio.gather(*(self._ready(slot, timeout_s) for slot in range(self._count)))

    async def ready(self, address: str, port: int, *, timeout_s: float = 30.0) -> None:
        """Start the BMC's worker if needed and wait until it runs: a process start is
        not charged to a BMC call's deadline."""
        await self._ready(self.slot_of(address, port), timeout_s)

    async def _ready(self, slot: int, timeout_s: float) -> None:
        worker = await self._worker(slot)
        try:
            async with asyncio.timeout(timeout_s):
                await worker.ready.wait()
        except TimeoutError:
            self._replace(worker, f"did not start within {timeout_s:g} s")
            raise BmcUnreachable(f"IPMI worker {worker.pid} did not start") from None

    async def call(self, address: str, port: int, user: str, password: str, op: str,
                   args: dict[str, Any] | None = None, *, timeout_s: float) -> Answer:
        """One call on the BMC's worker; the caller's ``asyncio.timeout`` bounds the wait.
        ``timeout_s`` is the deadline the watchdog holds the worker to (plus grace)."""
        worker = await self._worker(self.slot_of(address, port))
        rid = next(self._ids)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        worker.pending[rid] = (future, time.monotonic() + timeout_s + self._grace_s)
        line = json.dumps({"id": rid, "bmc": [address, port, user, password], "op": op,
                           "args": args or {}, "timeout_s": timeout_s},
                          separators=(",", ":")).encode() + b"\n"
        try:
            assert worker.proc.stdin is not None
            worker.proc.stdin.write(line)
            await worker.proc.stdin.drain()
            return await asyncio.shield(future)
        except (ConnectionError, RuntimeError) as exc:
            raise BmcUnreachable(f"IPMI worker {worker.pid} gone: {exc}") from None
        finally:
            if not future.done():  # the caller gave up; the watchdog still holds the worker
                future.add_done_callback(_consume)

    async def aclose(self, *, logout_timeout_s: float = 10.0) -> None:
        """Log every session out (each worker, at most ``logout_timeout_s``), then stop."""
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        workers = [w for w in self._workers if w is not None and not w.dead]
        await asyncio.gather(*(self._stop(w, logout_timeout_s) for w in workers))
        await asyncio.gather(*self._tasks, return_exceptions=True)  # killed ones reaped
        self._workers = [None] * self._count

    # -- workers ---------------------------------------------------------------------------

    async def _worker(self, slot: int) -> _Worker:
        worker = self._workers[slot]
        if worker is not None and not worker.dead:
            return worker
        if self._closed:
            raise BmcUnreachable("IPMI workers are shut down")
        async with self._starting[slot]:
            worker = self._workers[slot]
            if worker is None or worker.dead:
                worker = self._workers[slot] = await self._spawn(slot)
            if self._watchdog is None:
                self._watchdog = asyncio.get_running_loop().create_task(
                    self._watch(), name="ipmi-watchdog")
            return worker

    async def _spawn(self, slot: int) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            self._python, "-m", _MODULE, "--threads", str(self._threads), "--heartbeat-s",
            str(self._heartbeat_s), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, limit=_LINE_LIMIT, start_new_session=True)
        worker = _Worker(slot, proc, time.monotonic())
        worker.reader = asyncio.get_running_loop().create_task(
            self._read(worker), name=f"ipmi-worker-{proc.pid}")
        log.info("ipmi: worker %d started (pid %d)", slot, proc.pid)
        return worker

    async def _read(self, worker: _Worker) -> None:
        assert worker.proc.stdout is not None
        try:
            while line := await worker.proc.stdout.readline():
                worker.last_beat = time.monotonic()  # any line proves it is alive
                message = json.loads(line)
                if "ready" in message:
                    worker.ready.set()
                entry = worker.pending.pop(message.get("id"), None) if "id" in message \
                    else None
                if entry is None or entry[0].done():
                    continue
                if "error" in message:
                    error = message["error"]
                    entry[0].set_exception(WorkerError(str(error.get("kind")),
                                                       str(error.get("text"))))
                else:
                    entry[0].set_result(Answer(message.get("ok"),
                                               bool(message.get("session"))))
        except (ValueError, OSError) as exc:
            log.warning("ipmi: worker %d (pid %d): bad output: %s", worker.slot,
                        worker.pid, exc)
        if not worker.dead and not self._closed:
            self._replace(worker, "exited")

    async def _watch(self) -> None:
        period = max(0.05, self._heartbeat_s / 2)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for worker in list(self._workers):
                if worker is None or worker.dead:
                    continue
                if now - worker.last_beat > self._heartbeat_timeout_s:
                    self._replace(worker, f"missed its heartbeat for "
                                          f"{now - worker.last_beat:.1f} s")
                elif any(hard < now for _f, hard in worker.pending.values()):
                    self._replace(worker, f"left a call unanswered {self._grace_s:g} s "
                                          "past its deadline")

    def _replace(self, worker: _Worker, reason: str) -> None:
        """Kill it, fail its calls in flight (retryable); the slot respawns on next use."""
        worker.dead = True
        self.replaced += 1
        log.warning("ipmi: worker %d (pid %d) %s: killed and replaced; %d calls fail",
                    worker.slot, worker.pid, reason, len(worker.pending))
        with contextlib.suppress(ProcessLookupError):
            worker.proc.send_signal(signal.SIGKILL)
        error = BmcUnreachable(f"IPMI worker {worker.pid} {reason}; call abandoned")
        for future, _hard in worker.pending.values():
            if not future.done():
                future.set_exception(error)
        worker.pending.clear()
        task = asyncio.get_running_loop().create_task(_reap(worker),
                                                      name=f"ipmi-reap-{worker.pid}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop(self, worker: _Worker, timeout_s: float) -> None:
        worker.dead = True
        proc = worker.proc
        try:
            async with asyncio.timeout(timeout_s):
                assert proc.stdin is not None
                proc.stdin.write(b'{"id":0,"op":"logout_all"}\n')
                await proc.stdin.drain()
                proc.stdin.close()
                await proc.wait()
        except (TimeoutError, ConnectionError, OSError):
            log.warning("ipmi: worker %d (pid %d) did not log out in %g s; killed",
                        worker.slot, proc.pid, timeout_s)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if worker.reader is not None:
            worker.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker.reader


async def _reap(worker: _Worker) -> None:
    """Wait for a killed worker and close its pipes (its transport then closes too)."""
    await worker.proc.wait()
    if worker.proc.stdin is not None:
        worker.proc.stdin.close()
    if worker.reader is not None and not worker.reader.done():
        worker.reader.cancel()


def _consume(future: asyncio.Future[Answer]) -> None:
    if not future.cancelled():
        future.exception()
